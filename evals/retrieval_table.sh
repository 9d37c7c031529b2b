#!/bin/bash
# The retrieval tables of docs/retrieval.md, as run for them (2 CPU cores, alone, ~35 min with the
# models present): SciFact dev claims over the full corpus and 500 SQuAD dev-article questions,
# each with the base encoder (minilm) and make models' minilm-tuned + minilm-rerank, then the
# default configuration's latency at 100,000 chunks. Needs `make models` (or the two training
# commands in docs/retrieval.md) for minilm-tuned and minilm-rerank.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
O=${OUT:-artifacts/evals/retrieval}
stamp() { echo "=== $(date +%T) $* | load $(cut -d' ' -f1-3 /proc/loadavg)"; }
S="--dataset $DATA/scifact --split train --queries dev"
Q="--dataset squad:$DATA/squad/squad-v1.1-dev-part.json --queries dev --limit 500"
ROWS="--retriever bm25 dense hybrid --fusion rrf convex --alpha 0.5 --device cpu --latency"
RERANK="--rerank minilm-rerank --rerank-on hybrid-convex --rerank-weight 1 0.5"
mkdir -p "$O"
for set in scifact squad; do
  [ $set = scifact ] && D=$S || D=$Q
  stamp "$set: minilm"
  $PY -m evals.retrieval $D $ROWS --encoder minilm --out $O/$set-dev-base.json
  stamp "$set: minilm-tuned + minilm-rerank, depth 10 (the default) and 20"
  $PY -m evals.retrieval $D $ROWS --encoder minilm-tuned $RERANK --rerank-depth 10 --out $O/$set-dev-tuned-d10.json
  $PY -m evals.retrieval $D --retriever hybrid --fusion convex --alpha 0.5 --device cpu --latency \
    --encoder minilm-tuned $RERANK --rerank-depth 20 --out $O/$set-dev-tuned-d20.json
done
for p in fp32 int8; do
  stamp "latency at 100k chunks, reranker $p"
  $PY -m benchmarks.search_latency --sizes 100000 --queries 200 --threads 2 --k 5 \
    --rerank minilm-rerank --rerank-depth 10 20 --rerank-max-length 192 --rerank-precision $p \
    --out artifacts/benchmarks/search_latency_$p
done
stamp done

#!/bin/bash
# The grounded-QA table of docs/answering.md: LoRA recipes, SQuAD RAG-mode QA (300 answerable +
# 100 unanswerable questions) and the Python-docs QA set, per decoder. Run alone (`make eval-answers`).
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
S=../shared/data/squad/squad-v1.1-dev-part.json
O=artifacts/evals/answers
stamp() { echo "=== $(date +%T) $* | load $(cut -d' ' -f1-3 /proc/loadavg)"; }
QA="--squad $S --mode rag --retriever hybrid --k 5 --limit 300 --removed-articles 2 --unanswerable-limit 100 --max-new-tokens 48 --complete-citations"
LORA="--data $S --docs ../shared/data/corpus/linux-doc --doc-fraction 0.2 --doc-passage-words 80 --k-passages 5 --passage-words 50 --refusal-fraction 0.2 --max-examples 360 --batch-size 1 --grad-accum 4 --no-eval --merge"

stamp lora qwen
.venv/bin/python -m training.lora --model qwen2.5-coder-0.5b --out artifacts/models/qwen2.5-coder-0.5b-lora $LORA \
  --lr 5e-4 --r 16 --alpha 32 --top-layers 12 --target-modules q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
stamp qa qwen+lora
.venv/bin/python -m evals.qa $QA --generator qwen2.5-coder-0.5b --adapter artifacts/models/qwen2.5-coder-0.5b-lora --out $O/qa-qwen05-lora.json
stamp ingest pydocs
.venv/bin/python -m rag.ingest ../shared/data/python-docs --index pydocs
stamp docqa qwen+lora
.venv/bin/python -m evals.docqa --index pydocs --decoder qwen2.5-coder-0.5b --adapter artifacts/models/qwen2.5-coder-0.5b-lora --max-new-tokens 128 --out $O/docqa-qwen05-lora.json
stamp lora smollm2
.venv/bin/python -m training.lora --model smollm2 --out artifacts/models/smollm2-lora $LORA --lr 1e-3
stamp qa smollm2+lora
.venv/bin/python -m evals.qa $QA --generator smollm2 --adapter artifacts/models/smollm2-lora --out $O/qa-smollm2-lora.json
stamp qa qwen zero-shot
.venv/bin/python -m evals.qa $QA --generator qwen2.5-coder-0.5b --out $O/qa-qwen05.json
stamp qa smollm2 zero-shot
.venv/bin/python -m evals.qa $QA --generator smollm2 --out $O/qa-smollm2.json
for row in "qwen2.5-coder-0.5b:" "smollm2:artifacts/models/smollm2-lora" "smollm2:"; do
  d=${row%%:*}; a=${row#*:}
  stamp docqa $d $a
  .venv/bin/python -m evals.docqa --index pydocs --decoder $d ${a:+--adapter $a} --max-new-tokens 128 --out $O/docqa-$d${a:+-lora}.json
done
stamp done

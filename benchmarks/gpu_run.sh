#!/bin/bash
# The GPU jobs in one prepared run (<= 10 min on one H200), so a GPU machine is used at once:
#
#   1. alone on the GPU (timings): the pretraining throughput / MFU benchmark at the base preset
#      (B = 64, T = 512), eager and with torch.compile (benchmarks/pretrain_throughput.py);
#   2. together on the GPU (quality runs; each too small to fill an H200): the larger extractive
#      reader (training.finetune.reader, 4 distractors per question, 3 epochs, every dev question), the
#      reader-first LoRA recipe on the default decoder (training.finetune.lora --prompt-format span,
#      2,000 distilled examples, every layer) and the base-preset division-of-labour run
#      (evals.division_of_labor).
#
# Every result goes into one folder: <job>.json (the command's --json), <job>.log (its stderr),
# jobs.tsv (name, exit status, seconds, limit), hardware.txt, the small files of each training
# run (run.json, train_log.jsonl, loss.png), dol/ (the experiment's cells and report) and
# summary.md, one row per job (benchmarks/gpu_summary.py). A job that fails or runs out of time
# is a row saying so; the others still run. Models and checkpoints stay in $WORK, outside the
# results folder: the division-of-labour cells there are kept, so rerunning this script on the
# same machine resumes that experiment where it stopped.
#
#   bash benchmarks/gpu_run.sh [--dry-run] [OUT_DIR]
#   PACK=gpu-pack bash benchmarks/gpu_run.sh [--dry-run] [OUT_DIR]   # on the lent GPU machine
#
# OUT_DIR: the results folder (default $OUT, else artifacts/gpu_run/<date-time>). --dry-run: the
# same jobs at tiny sizes on the CPU (tests/test_gpu_run.py runs it), nothing compiled.
# PACK (make gpu-pack, benchmarks/gpu_pack.py): the packed run, for a machine with no registry
# and no ../shared/data: verify the pack, unpack it into $WORK/pack (data/ is DATA), install its
# wheels into SITE ($WORK/site, emptied first; PYTHONPATH=SITE:.), run with python3, and hand
# back at most 8 files in OUT_DIR: results.tar.xz (every small result), summary.md, plots.
# Default JOBS there: throughput throughput-compile dol (the reader's and the LoRA's models
# are registry packages of 88-470 MB: they cannot travel).
# Environment: PY (python; default .venv/bin/python, python3 with PACK), DATA (../shared/data),
# WORK (models and checkpoints; default ${TMPDIR:-/tmp}/gpu_run_work), BUDGET_S (wall-clock
# budget, 570), JOBS (a subset of: throughput throughput-compile reader lora dol), READER_MODEL
# (minilm), LORA_MODEL (qwen2.5-coder-0.5b; dry run: smollm2), DOL_ROWS ("mlm15 clm"),
# DOL_SEEDS ("0 1"), DOL_JOBS (rows x seeds: every pair a worker process at once), DOL_CELLS
# (cells of an earlier run to resume from: the dol/cells folder of its results.tar.xz; default
# $PACK/dol-cells), DOL_FLAGS (--no-baselines), PACK, SITE.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export RAG_PROGRESS_INTERVAL=${RAG_PROGRESS_INTERVAL:-20}

case " $* " in *" -h "* | *" --help "*) sed -n '2,37p' "$0"; exit 0 ;; esac
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
if [ $# -gt 1 ] || [[ "${1:-}" == -* ]]; then
  echo "gpu_run.sh: error: usage: bash benchmarks/gpu_run.sh [--dry-run] [OUT_DIR]" >&2
  exit 2
fi
O=${1:-${OUT:-artifacts/gpu_run/$(date +%Y%m%d-%H%M%S)}}
PACK=${PACK:-}
if [ -n "$PACK" ]; then
  PY=${PY:-python3}  # no .venv on the lent machine: its image's python and the pack's wheels
elif [ -x .venv/bin/python ]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi
DATA=${DATA:-../shared/data}
WORK=${WORK:-${TMPDIR:-/tmp}/gpu_run_work}
BUDGET_S=${BUDGET_S:-570}
if [ -n "$PACK" ]; then
  [ -f "$PACK/MANIFEST.json" ] || { echo "gpu_run.sh: error: PACK=$PACK: no MANIFEST.json (make gpu-pack)" >&2; exit 2; }
  PACK=$(cd "$PACK" && pwd)
  JOBS=${JOBS:-throughput throughput-compile dol}
  RETURN=$O                                   # what comes back: <= 8 files
  O=$WORK/results-$(date +%Y%m%d-%H%M%S)     # every result, packed into RETURN at the end
  UNPACKED=$WORK/pack  # data/ (the run's DATA) and wheels/
  DATA=$UNPACKED/data
  SITE=${SITE:-$WORK/site}
else
  JOBS=${JOBS:-throughput throughput-compile reader lora dol}
fi
SQUAD=$DATA/squad/squad-v1.1-dev-part.json
DOL_ROWS=${DOL_ROWS:-mlm15 clm}
DOL_SEEDS=${DOL_SEEDS:-0 1}
DOL_FLAGS=${DOL_FLAGS:---no-baselines}
# shellcheck disable=SC2206  # the lists are meant to split
dol_rows=($DOL_ROWS) dol_seeds=($DOL_SEEDS)
DOL_JOBS=${DOL_JOBS:-$((${#dol_rows[@]} * ${#dol_seeds[@]}))}  # every (row, seed) at once
# cells of an earlier run (dol/cells of its results.tar.xz) to resume from: its finished pairs
# are not run again
DOL_CELLS=${DOL_CELLS:-${PACK:+$PACK/dol-cells}}
READER_MODEL=${READER_MODEL:-minilm}
if [ $DRY = 0 ] && ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "gpu_run.sh: error: no CUDA GPU visible to $PY (use --dry-run on a CPU)" >&2
  exit 2
fi
mkdir -p "$O" "$WORK"
O=$(cd "$O" && pwd)
: >"$O/jobs.tsv"
START=$(date +%s)

say() { echo "=== $(date +%T) $*" | tee -a "$O/run.log" >&2; }

# ---- 0. the pack (PACK): its data and wheels in place of ../shared/data and a registry -------
# pack_failed WHAT: the error line, and pack.log into the folder that comes back
pack_failed() {
  echo "gpu_run.sh: error: $1: $(tail -1 "$O/pack.log")" >&2
  mkdir -p "$RETURN" && cp "$O/pack.log" "$RETURN/"
  exit 2
}
if [ -n "$PACK" ]; then
  say "pack $PACK: verify it, unpack it into $UNPACKED, install its wheels into $SITE"
  "$PY" -m benchmarks.gpu_pack --out "$PACK" --unpack "$UNPACKED" >/dev/null 2>>"$O/pack.log" ||
    pack_failed "the pack does not verify or unpack"
  rm -rf "$SITE"
  same_python() {  # is PY the Python the pack's wheels are for?
    "$PY" -c 'import json, sys; m = json.load(open(sys.argv[1]))
sys.exit(m["python"] != "%d.%d" % sys.version_info[:2])' "$PACK/MANIFEST.json"
  }
  if ! compgen -G "$UNPACKED/wheels/*.whl" >/dev/null; then
    say "the pack has no wheels: $PY's own packages stand in"
  elif [ $DRY = 1 ] && ! same_python; then
    say "dry run: the pack's wheels are for another Python than $PY: not installed, its own packages stand in"
  else
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
      "$UNPACKED"/wheels/*.whl >>"$O/pack.log" 2>&1 || pack_failed "installing the pack's wheels failed"
  fi
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" RAG_SHARED_DATA=$DATA
  say "pack ready after $(($(date +%s) - START))s"
fi
wanted() { [[ " $JOBS " == *" $1 "* ]]; }
left() { echo $((BUDGET_S - ($(date +%s) - START))); }

# run_job NAME LIMIT_S CMD...: stdout -> NAME.json, stderr -> NAME.log, a row in jobs.tsv
run_job() {
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  say "$name (limit ${limit}s): $*"
  timeout -k 15 "$limit" "$@" >"$O/$name.json" 2>"$O/$name.log"
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t0))" "$limit" >>"$O/jobs.tsv"
  say "$name: exit $rc after $(($(date +%s) - t0))s"
}

# the small files of a training run's folder into the results
keep_run() {
  mkdir -p "$O/$2"
  for f in run.json train_log.jsonl loss.png reader.json; do
    [ -f "$1/$f" ] && cp "$1/$f" "$O/$2/"
  done
  return 0
}

if [ $DRY = 1 ]; then
  DEV=cpu
  LORA_MODEL=${LORA_MODEL:-smollm2}
  TP="--presets tiny --batch-size 2 --seq-len 32 --steps 1 --rounds 1 --warmup 0 --threads 1"
  TP_COMPILE=""  # torch.compile takes minutes on a CPU: the dry run checks the plumbing
  READER="--max-steps 2 --batch-size 2 --max-questions 8 --negatives 1 --calibration-questions 4
    --calibration-negatives 1 --max-length 96 --stride 32 --eval-max-questions 4 --precision fp32
    --threads 1 --logging-steps 1"
  LORA="--prompt-format span --span-targets distill --max-steps 1 --batch-size 1
    --grad-accum 1 --max-examples 2 --eval-examples 2 --eval-batch-size 2
    --max-new-tokens 4 --precision fp32 --threads 1 --logging-steps 1"
  DOL="--preset tiny --rows mlm15 clm --seeds 0 --no-baselines --threads 1 --jobs 2"
  DOL_OUT=$WORK/dol-tiny
  T_TP=240 T_TPC=240
else
  DEV=cuda
  LORA_MODEL=${LORA_MODEL:-qwen2.5-coder-0.5b}
  TP="--presets base --batch-size 64 --seq-len 512 --steps 10 --rounds 3 --warmup 3"
  TP_COMPILE="--compile"
  # the reader: the make-models recipe with k = 5 passages in training too, longer
  READER="--negatives 4 --epochs 3 --eval-max-questions 0"
  # training.finetune.lora.span_preset_config(..., preset="base"): make models' reader-first recipe at
  # GPU size, as flags (tests/test_gpu_run.py checks they do not drift)
  LORA="--prompt-format span --span-targets distill --docs $DATA/corpus/linux-doc
    --doc-fraction 0.2 --max-examples 2000 --top-layers 0 --r 16 --alpha 32
    --target-modules q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
    --eval-examples 200 --batch-size 8 --grad-accum 2 --lr 2e-4 --max-new-tokens 80 --merge"
  DOL="--preset base --rows $DOL_ROWS --seeds $DOL_SEEDS --jobs $DOL_JOBS $DOL_FLAGS"
  DOL_OUT=$WORK/dol-base  # kept: the next run on this machine resumes from its cells
  T_TP=90 T_TPC=180
fi

{
  echo "date: $(date -Is)"
  echo "mode: $([ $DRY = 1 ] && echo dry-run || echo gpu)$([ -n "$PACK" ] && echo ", packed")"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
  fi
  echo "python: $("$PY" -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -1)"
  echo "budget_s: $BUDGET_S"
  if [ -n "$PACK" ]; then
    echo "pack: $PACK, $("$PY" -c 'import json, sys; m = json.load(open(sys.argv[1])); a = m["archives"]; print("built", m["built"], "at", m["commit"], "with", sum(len(x["files"]) for x in a if x["kind"] == "wheels"), "wheels and", sum(x["kind"] == "data" for x in a), "data archives")' "$PACK/MANIFEST.json" 2>&1 | tail -1)"
  fi
} >"$O/hardware.txt"
say "results in $O, models in $WORK, budget ${BUDGET_S}s, jobs: $JOBS"

# ---- 1. alone on the device: throughput ---------------------------------------------------
# shellcheck disable=SC2086  # the flag strings are meant to split
wanted throughput && run_job throughput $T_TP \
  "$PY" -m benchmarks.pretrain_throughput --device $DEV $TP --json
# shellcheck disable=SC2086
wanted throughput-compile && run_job throughput-compile $T_TPC \
  "$PY" -m benchmarks.pretrain_throughput --device $DEV $TP $TP_COMPILE --json

# ---- 2. together: reader, LoRA, division of labour -------------------------------------
LIMIT=$(($(left) - 30))  # 30 s kept for copying results and the summary
if [ "$LIMIT" -lt 60 ]; then LIMIT=60; fi
# shellcheck disable=SC2086
wanted reader && run_job reader $LIMIT "$PY" -m training.finetune.reader --model "$READER_MODEL" \
  --squad "$SQUAD" --out "$WORK/reader" --device $DEV $READER --json &
# shellcheck disable=SC2086
wanted lora && run_job lora $LIMIT "$PY" -m training.finetune.lora --model "$LORA_MODEL" \
  --data "$SQUAD" --out "$WORK/lora" --device $DEV $LORA --json &
if wanted dol && [ -n "$DOL_CELLS" ] && compgen -G "$DOL_CELLS/*.json" >/dev/null; then
  mkdir -p "$DOL_OUT/cells"
  cp -n "$DOL_CELLS"/*.json "$DOL_OUT/cells/"
  say "dol: resuming from the $(find "$DOL_CELLS" -name 'done__*.json' | wc -l) finished pairs in $DOL_CELLS"
fi
# shellcheck disable=SC2086
wanted dol && run_job dol $LIMIT "$PY" -m evals.division_of_labor $DOL --device $DEV \
  --scifact "$DATA/scifact" --squad "$SQUAD" --wikitext "$DATA/wikitext-2/wiki.valid.tokens" \
  --out "$DOL_OUT" --json &
wait

wanted reader && keep_run "$WORK/reader" reader
wanted lora && keep_run "$WORK/lora" lora
if wanted dol && [ -d "$DOL_OUT" ]; then
  mkdir -p "$O/dol"
  cp -r "$DOL_OUT/cells" "$O/dol/" 2>/dev/null
  for f in "$DOL_OUT"/*.json "$DOL_OUT"/*.md "$DOL_OUT"/*.png; do
    [ -f "$f" ] && cp "$f" "$O/dol/"
  done
fi
if [ -n "$PACK" ]; then
  "$PY" -m benchmarks.gpu_summary --out "$O" --returned "$RETURN" >&2
  say "done in $(($(date +%s) - START))s: $RETURN (from $O)"
else
  "$PY" -m benchmarks.gpu_summary --out "$O" >&2
  say "done in $(($(date +%s) - START))s: $O/summary.md"
fi

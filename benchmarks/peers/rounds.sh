#!/usr/bin/env bash
# Alternating rounds: every trainer once per round, the order rotated each round, so that a change in the
# machine's load hits them all alike; then every draft's val/loss by draftlab's evaluator (val_loss.py) and the
# summary with same-round ratios (summary.py, which also writes RESULTS/round-<k>/results.json).
#   ROUNDS=3 TRAINERS="dl-new speculators specforge" benchmarks/peers/rounds.sh
# dl-<label> is draftlab from the tree in $DL_TREE_<label> (default $DL_TREE_new; e.g. DL_TREE_main=/work/dl-main)
# with the extra overrides in $DL_ARGS_<label> (e.g. DL_ARGS_nographs="train.compile_cuda_graphs=false"); see run.sh
# for the rest of the environment (DATA, RESULTS, DEVICE, ...). Round k trains every trainer with seed k - 1 (SEED
# fixes one for all rounds): the rounds' val/loss spread is the seed noise summary.py judges quality by. PROFILE=1:
# one step of each trainer in the last round is profiled (step PROFILE_AT, default 10: inside the warm-up that the
# steady rate leaves out). SHAPE names the results in the summary; MFU is reported two ways, against the card's datasheet
# dense bf16 peak and its measured matmul rate (src/draftlab/benchmarks/peaks.py); PEAK_TFLOPS: an untabled card's peak.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/settings.sh"
data=${DATA:-$PEERS/data}
read -r -a trainers <<< "${TRAINERS:-dl-new speculators specforge}"
n=${#trainers[@]}
last=${ROUNDS:-2}
for round in $(seq "${FIRST_ROUND:-1}" "$last"); do
  for i in $(seq 0 $((n - 1))); do
    t=${trainers[$(((i + round - 1) % n))]}
    profile=0
    [ "${PROFILE:-0}" = 1 ] && [ "$round" = "$last" ] && profile=${PROFILE_AT:-10}
    seed=${SEED:-$((round - 1))}
    case $t in
      dl-*) tree_var="DL_TREE_${t#dl-}" args_var="DL_ARGS_${t#dl-}"
            DL_TREE=${!tree_var:-$DL_TREE_new} DL_ARGS=${!args_var:-} SEED=$seed PROFILE_STEP=$profile \
              "$here/run.sh" draftlab "r$round-$t" ;;
      *) SEED=$seed PROFILE_STEP=$profile "$here/run.sh" "$t" "r$round-$t" ;;
    esac
    echo "round $round $t rc=$(cat "$RESULTS/r$round-$t/rc") wall=$(cat "$RESULTS/r$round-$t/wall.txt") s"
  done
done
py=${DL_PYTHON:-python3}
peak=${PEAK_TFLOPS:-}
export PYTHONPATH="$here/../../src${DL_SITE:+:$DL_SITE}"
"$py" "$here/val_loss.py" "$RESULTS" "$data/split.json" --device "$DEVICE" --batch-tokens "$BATCH_TOKENS" \
  --ttt-steps "$TTT" 2> "$RESULTS/val_loss.err" || echo "val_loss.py failed: $RESULTS/val_loss.err"
"$py" "$here/summary.py" "$RESULTS" "$data/split.json" ${SHAPE:+--shape "$SHAPE"} ${peak:+--peak-tflops "$peak"}

#!/usr/bin/env bash
# Issue 11 part 4 on one host: today's trainer against the issue's code (5c67ce0, where training ran at 80k tok/s),
# in one call on one nvidia-h200, because hosts differ: the same training code ran at 260.3k tok/s in one headline and
# 459.6k in the next (BENCHMARKS.md, twelfth session). Prepare here, from the repository root:
#   rm -rf .oldcode && mkdir -p .oldcode && git archive 5c67ce0 src bench | tar -x -C .oldcode
# One call (carry .whl .speed .oldcode; about 6 minutes, 10 with today_cpp): bash bench/h200_train_vs_issue.sh
#   (the sixteenth session ran STEPS=600 RUNS="issue today today_cg": 309 s)
#   (RUNS="issue today" runs only those; STEPS sets trainer_speed's steps, default 300; ISSUE_REPEATS the issue's runs)
# Runs, in turn (JSON lines in $OUT/train_vs_issue.jsonl, logs in $OUT/train_vs_issue.err):
#   issue:        the issue's step alone at its default (bench/train_throughput.py, 4,096 tokens, full-vocabulary
#                 targets, eager): its real trainer ran slower than this (80k against 101k), so ratios against it
#                 are conservative
#   today_step:   today's bench/train_throughput.py with the same flags: how much the host alone moves the step
#   today_eager:  today's real trainer (bench/trainer_speed.py, synthetic SmolLM2-shaped shards, 40% prompt,
#                 validation and checkpoints every 100 steps) at the GPU preset's 16,384 tokens, eager unroll
#   today:        the same, compiled unroll (the preset's way; compiling cold, about 140 s, left out of its tok/s)
#   today_cpp:    the same with train.compile_cpp_wrapper (the compiled step is host-bound; its own cold compile)
#   today_cg:     the same with train.compile_cuda_graphs (batches padded to buckets, a CUDA graph replayed for
#                 each; its own cold compile, and each bucket's recording inside the timed steps)
set -uo pipefail
export PYTHONUNBUFFERED=1 SITE=/tmp/site
. "$(dirname "$0")/gpu_machine.sh"  # install_wheels, keep_first_half
mkdir -p "$OUT"
install_wheels .whl && keep_first_half || exit 1
[ -d .oldcode/src ] || { echo "no .oldcode: see this script's header"; exit 1; }
log=$OUT/train_vs_issue.jsonl; err=$OUT/train_vs_issue.err
# a run's JSON line tagged with its name; bench/host_load.py's line about it with NAME_load
tag() { sed -e "s/^{\"host_load\"/{\"run\": \"$1_load\", \"host_load\"/" -e "t" -e "s/^{/{\"run\": \"$1\", /" \
  | grep '^{' | tee -a "$log" | cut -c1-300; }
want() { [[ " ${RUNS:-issue today_step today_eager today today_cpp today_cg} " == *" $1 "* ]]; }
nvidia-smi -L; nproc
# the GPU sampled every 250 ms through every run ($OUT/train_vs_issue_smi.csv): the issue's step ran at 47-95k on one
# machine with the GPU at its top clock and about half idle (twenty-third session); each issue_load line's `clock`
# is its run's span in this log's timestamps, so a run's GPU utilisation can be read beside its rate
nvidia-smi --query-gpu=timestamp,clocks.sm,utilization.gpu,power.draw,clocks_event_reasons.active --format=csv \
  -lms 250 > "$OUT/train_vs_issue_smi.csv" 2>/dev/null & sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT
# the issue's step ran at 60.8k and 86.0k on one machine 20 minutes apart (twenty-second session): ISSUE_REPEATS runs
# it that many times in a row, each followed by a line with the host's load over it (bench/host_load.py)
want issue && for _ in $(seq ${ISSUE_REPEATS:-1}); do
  (cd .oldcode && PYTHONPATH=$SITE:src timeout 120 python3 ../bench/host_load.py -- python3 bench/train_throughput.py \
    --preset smollm2 --batch-tokens 4096) 2>> "$err" | tag issue
done
want today_step && PYTHONPATH=$SITE:src timeout 120 python3 bench/train_throughput.py --preset smollm2 \
  --batch-tokens 4096 --targets full 2>> "$err" | tag today_step
for name in today_eager today today_cpp today_cg; do
  want $name || continue
  case $name in today_eager) flags=(--compile-unroll false) ;; today) flags=(--compile-unroll true) ;;
    today_cpp) flags=(--compile-unroll true --cpp-wrapper) ;;
    today_cg) flags=(--compile-unroll true --cuda-graphs) ;; esac
  PYTHONPATH=$SITE:src timeout 280 python3 bench/trainer_speed.py --batch-tokens 16384 --samples 2048 \
    --steps ${STEPS:-300} "${flags[@]}" 2>> "$err" | tag $name
done
# each wrapped run's rate beside the GPU's samples over it (bench/gpu_util_runs.py)
want issue && python3 bench/gpu_util_runs.py "$log" "$OUT/train_vs_issue_smi.csv" | tee "$OUT/issue_gpu_util.jsonl"

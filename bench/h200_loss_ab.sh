#!/usr/bin/env bash
# A change to the trainer's loss against the code before it, on one nvidia-h200: the loss alone
# (bench/loss_kernel.py), then the whole trainer of each code, cold and warm, alternated. First for the teacher's
# soft targets as bf16 logits (BASE b22887f; BENCHMARKS.md, twenty-fourth session), next for the loss over every
# pair at once (BASE 998b905; "Left to run" item 2). Prepare here, from the repository root, the two codes side by
# side (BASE: the commit before the change):
#   rm -rf .ab && mkdir -p .ab/new .ab/base
#   git archive HEAD src conf bench ':!bench/results' | tar -x -C .ab/new
#   git archive BASE src conf bench ':!bench/results' | tar -x -C .ab/base
# Calls, back to back on one warm machine (a machine idle 30 s is given back, with /tmp and the compile cache):
#   call 1 (carry .whl .speed .ab): bash bench/h200_loss_ab.sh install && RUNS=new_cold bash bench/h200_loss_ab.sh ab
#     (wheels, the two codes, the loss alone in its three forms, then the new code's cold run: about 400 s; a cold
#     run takes about 230)
#   call 2 (nothing carried):       RUNS="base_cold new base" bash bench/h200_loss_ab.sh ab
#   call 3 (nothing carried):       RUNS="new base new base" bash bench/h200_loss_ab.sh ab
# A run is h200_headline.sh trainer_ab's (gpu_machine.sh trainer_ab_run: validation compiled, 700 steps on the
# 64-shard synthetic pool in /tmp/dl/pool), with CUDA graphs; NAME_cold is the first of that code on the machine (its
# compile cold), NAME a warm one. JSON lines in $OUT/loss_ab.jsonl, tagged with the run's name; logs in .err.
set -uo pipefail
step=${1:?usage: h200_loss_ab.sh install|ab}
export PYTHONUNBUFFERED=1 SITE=/tmp/site
. "$(dirname "$0")/gpu_machine.sh"  # install_wheels, keep_first_half, trainer_ab_run
AB=/tmp/ab; ROOT=/tmp/dl
mkdir -p "$ROOT" "$OUT"

case "$step" in
install)
  nvidia-smi -L; nproc
  install_wheels .whl && keep_first_half || exit 1
  [ -d .ab/new/src ] && [ -d .ab/base/src ] || { echo "no .ab/new and .ab/base: see this script's header"; exit 1; }
  rm -rf $AB && cp -r .ab $AB
  (cd $AB/new && PYTHONPATH=$SITE timeout 300 python3 bench/loss_kernel.py --device cuda) \
    | tee -a "$OUT/loss_kernel.jsonl" ;;
ab)
  for run in ${RUNS:?RUNS: e.g. \"new_cold base_cold new base\"}; do
    CODE=$AB/${run%_cold} TAG=$run trainer_ab_run loss_ab --cuda-graphs
  done ;;
*) echo "unknown step $step"; exit 2 ;;
esac

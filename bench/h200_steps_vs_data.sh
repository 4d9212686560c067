#!/usr/bin/env bash
# Issue 10, part 5: SmolLM2's real answer on one H200, with every data size trained to convergence. The lead runs
# it through the device tool, one phase per call; it extends bench/h200_session.sh's pattern: the device machine
# reaches no index or hub, so the wheels (.whl/, .whl-tf/), SmolLM2's GGUF in two halves (.gguf-a/, .gguf-b/:
# `split -b 50m`) and the prompts as JSONL (.gpu/sharegpt_prompts.jsonl, from
#   python bench/export_prompts.py .gpu/sharegpt_prompts.jsonl --count 32000 --max-chars 1500
# : 25,600 samples plus the pool's spare need more than the 24,000 the default exports) travel with the call.
# Jobs run with tracking.enabled=false and write results.json beside each Hydra job; every phase copies them to
# $OUT/steps_vs_data/, and back here
#   python -m draftlab import-runs <files_at>/steps_vs_data --experiment steps_vs_data_h200
#   python src/analyze.py steps_vs_data_h200
# logs them as one sweep and gives the verdict, the converged tau per size and the price of each doubling.
#
# Recipe: the issue's (128-token answers, lr 1e-3, 16,384-token batches), but warmup-stable-decay with early
# stopping: validation every 100 steps, stop after 4 passes without a 0.5% val/loss improvement, the plateau
# starts a decay of 20% of the steps so far, and the best pass is exported. A run that reaches the cap
# (train.max_steps, CAP) did not converge, and the analysis says so (train/stopped_early = 0).
#
# Resumable: each phase runs under `timeout` (LIMIT seconds, default 520, inside the 9-minute call limit) and
# calling the same phase again continues it: finished stages are cached, the generation and extraction pools
# grow by shards, and a killed train stage resumes from its last checkpoint (every 200 steps). Everything lives
# in /tmp/dl on the device machine, so all calls must come while the machine is still held (< 30 min, warm).
#
# Minutes at today's H200 speeds: generation 13.1k tok/s = ~100 samples/s at 128 new tokens; extraction ~2 min per
# 50k samples; training 0.2 s/step (0.23 with validation, bench/results/h200_data_scaling_jobs.jsonl); ~1 min of
# start-up per call. Steps to the plateau are guesses: in the issue's table 3,200 samples still gained 1.24 in loss
# per doubling of steps at 1,536 steps and 6,400 gained 1.6, so plateaus come late, from overfitting:
#                          guessed steps to plateau   minutes   answers
#   install                                           ~1        wheels + first GGUF half
#   converge 1600          ~1,500                     ~7        steps to converge at the smallest size
#   converge 3200          ~2,500                     ~9.5      the first converged data doubling (1,600 -> 3,200)
#   converge 6400          ~4,000                     ~15.5     the issue table's size, converged
#   converge 12800         ~6,000 (the cap)           ~25       generation of 6,400 more ~1.1 min, extract ~0.3
#   converge 25600         ~6,000 (the cap)           ~26       generation of 12,800 more ~2.2, extract ~0.5;
#                                                               at the cap it is NOT converged, and says so
#   seeds (1600, 6400)     ~5,500                     ~21       measured noise: intervals not assumed
#   ablate-layers @ Nconv  like converge Nconv        ~16       features: extract.layers=last (re-extract ~0.3)
#   ablate-capacity @ Nconv                           ~23       capacity: draft.num_layers=2 (~1.5x per step)
# Total ~145 minutes at 0.2 s/step: it does NOT fit the ~12 minutes left today. Each call runs up to LIMIT seconds
# and everything finished is in $OUT, so stop whenever the budget ends. In order of importance:
#   1. install, then `converge` (9 min): 1,600 converged, 3,200 started. Answers how many steps convergence takes
#      and how far below the fixed-epoch curve a converged point sits (the issue's 1,600 x 16 epochs = 384 steps
#      gave 15.03).
#   2. `converge` again (~9 min): 3,200 converged: the first data doubling at convergence, where the fixed-epoch
#      sweep and the steps_vs_data table disagree.
#   3. `converge` until 6,400 (and up) is done, then `seeds`, `ablate-layers`, `ablate-capacity`.
# With today's ~12 minutes only (1) fits. A faster trainer (the speed engineer's, issue 11) divides the training
# minutes (5x faster: ~35 minutes in all); rerun the estimates then. SIZES and CAP override the defaults.
set -euo pipefail
step=${1:?usage: h200_steps_vs_data.sh install|converge|seeds|ablate-layers|ablate-capacity|collect}
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
. bench/gpu_machine.sh  # install_wheels, keep_first_half, smollm2_gguf
ROOT=${ROOT:-/tmp/dl}
SIZES=${SIZES:-1600,3200,6400,12800,25600}  # ascending: the most important (cheapest) answers first
CAP=${CAP:-6000}
LIMIT=${LIMIT:-520}

collect() {  # every results.json so far, into $OUT (what comes back from the call)
  [ -n "${OUT:-}" ] || return 0
  (cd $ROOT && find steps -name results.json -o -name '*.yaml' -path '*/.hydra/*') 2>/dev/null |
    while read -r f; do mkdir -p "$OUT/steps_vs_data/$(dirname "$f")"; cp "$ROOT/$f" "$OUT/steps_vs_data/$f"; done
  echo "collected $(find "$OUT/steps_vs_data" -name results.json 2>/dev/null | wc -l) results.json"
}

prepare() {
  install_wheels .whl-tf && smollm2_gguf || exit 1
  mkdir -p $ROOT && cp -n .gpu/sharegpt_prompts.jsonl $ROOT/ 2>/dev/null || true
}

# The issue's recipe on the GPU, trained to convergence (experiment=data_scaling's settings, larger steps).
gpu=(paths.root=$ROOT tracking.enabled=false data.source=jsonl data.path=$ROOT/sharegpt_prompts.jsonl
     data.max_new_tokens=128 data.batch_size=512 data.shard_size=1024 extract.batch_size=64 extract.shard_size=512
     train.batch_tokens=16384 train.lr=1e-3 train.schedule=wsd train.max_steps=$CAP train.eval_every=100
     train.early_stop_patience=4 train.early_stop_min_delta=0.005 train.decay_ratio=0.2 train.checkpoint_every=200)
# bench costs ~70 s per job on this machine: predicted tau (val/predicted_tau) carries the answer; BENCH=1 adds it.
if [ "${BENCH:-0}" = 1 ]; then gpu+=('stages=[generate,extract,train,bench]' bench.prompts=8)
else gpu+=('stages=[generate,extract,train]'); fi

sweep() {  # sweep <name> <hydra overrides...>: one resumable multirun under $ROOT/steps/<name>
  local name=$1; shift
  local rc=0
  timeout --signal=TERM --kill-after=20 "$LIMIT" \
    python3 src/run.py -m experiment=data_scaling "${gpu[@]}" "$@" hydra.sweep.dir=$ROOT/steps/$name || rc=$?
  if [ $rc -eq 124 ]; then echo "phase $name: time limit reached; call the same phase again to continue"
  elif [ $rc -ne 0 ]; then collect; exit $rc; fi
}

largest_converged() {  # the largest data.samples whose seed-0 run stopped early (converged), from results.json
  python3 - "$ROOT/steps/converge" <<'EOF'
import json, pathlib, sys
best = 0
for f in pathlib.Path(sys.argv[1]).rglob("results.json"):
    r = json.loads(f.read_text())
    if r["metrics"].get("train/stopped_early") == 1.0:
        best = max(best, int(r["params"]["data.samples"]))
print(best or "")
EOF
}

case "$step" in
install)   # call 1: wheels, and the first half of the GGUF (~1 min)
  install_wheels .whl && keep_first_half ;;
converge)  # each size to convergence, seed 0, ascending
  prepare
  sweep converge data.samples=$SIZES train.seed=0 ;;
seeds)     # a second seed at two sizes: the measured noise behind every interval
  prepare
  sweep seeds data.samples=${SEED_SIZES:-1600,6400} train.seed=1 ;;
ablate-layers|ablate-capacity)  # features, then capacity, at the largest converged size (one per call)
  prepare
  n=${ABLATE_N:-$(largest_converged)}
  [ -n "$n" ] || { echo "$step: no converged size yet (run converge first)"; exit 2; }
  echo "$step at data.samples=$n"
  if [ "$step" = ablate-layers ]; then sweep ablate_layers data.samples=$n train.seed=0 extract.layers=last
  else sweep ablate_capacity data.samples=$n train.seed=0 draft.num_layers=2; fi ;;
collect) ;;
esac
collect

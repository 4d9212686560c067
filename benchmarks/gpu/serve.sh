#!/usr/bin/env bash
# The 50,000-sample SmolLM2 draft trained to convergence, then served by the real SGLang beside draftlab's local
# engine (serve.backend=both): both bench sets, batch sizes 1, 4, 16 as concurrent requests, and the serving grid.
# Run from the repository root with .gpu-stage/ there (benchmarks/gpu/stage.sh; SGLang's site archive as
# .gpu-stage/sglang/site.tar.xz):
#   bash benchmarks/gpu/serve.sh install  # machine.sh's install, and SGLang's site unpacked once it is there
#   bash benchmarks/gpu/serve.sh start    # detached: generate, extract, train (the draft packed), then the bench stage
#   bash benchmarks/gpu/serve.sh watch    # progress every minute until it ends or BUDGET s (540), then collect
#   bash benchmarks/gpu/serve.sh collect  # $OUT: log.txt, bench.tgz (each bench run's files and server
#                                         # logs); with DRAFT=1 also the train stage's folder (the draft, its
#                                         # metrics and completion record; no checkpoints) in parts of 15 MB
# Environment: G (/tmp/serve), BUDGET, GGUF_WAIT, DRAFTLAB_GIT_COMMIT, SAMPLES (50000), GRID (the bench.sglang_grid
# override), EXTRA (more overrides, words), TRAIN_ONLY=1 (generate, extract and train only: no SGLang site needed),
# BENCH_ONLY=1 (generate and bench, on a train folder an earlier machine's `DRAFT=1 collect` brought back and
# .gpu-stage/train/ carries: the same EXTRA, or the train stage's key differs and the bench refuses to start).
set -uo pipefail
G=${G:-/tmp/serve}
here=$(cd "$(dirname "$0")" && pwd)
code=$G/code
export PYTHONUNBUFFERED=1
. "$here/machine.sh"

install() {
  gpu_install .gpu-stage "$G" || return 1
  local archive=.gpu-stage/sglang/site.tar.xz
  if [ -f "$archive" ] && [ ! -d "$G/sglang-site/sglang" ]; then
    mkdir -p "$G/sglang-site" && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], \
filter='tar')" "$archive" "$G/sglang-site" || return 1
  fi
  echo "sglang: $([ -d "$G/sglang-site/sglang" ] && echo unpacked || echo missing)"
  if ls .gpu-stage/train/train.tgz.part-* > /dev/null 2>&1 && [ ! -d "$G/root/train" ]; then
    mkdir -p "$G/root" && cat .gpu-stage/train/train.tgz.part-* | tar -xz -C "$G/root" || return 1
  fi
  echo "train folder: $(ls -d "$G"/root/train/*/ 2> /dev/null || echo none)"
}

overrides() {  # the run's overrides: SmolLM2 on the staged prompts, SGLang from its own site for its process only
  local jit=$G/jit
  printf '%s\n' hardware=gpu "data.samples=${SAMPLES:-50000}" data.source=jsonl "data.path=$G/carried/prompts.jsonl" \
    "paths.root=$G/root" "tracking.uri=sqlite:///$G/mlflow.db" serve=sglang serve.backend=both serve.python=python3 \
    "+serve.env.PYTHONPATH=$G/sglang-site" +serve.env.HF_HUB_OFFLINE=1 +serve.env.TRANSFORMERS_OFFLINE=1 \
    "+serve.env.TVM_FFI_CACHE_DIR=$jit/tvm" "+serve.env.FLASHINFER_WORKSPACE_BASE=$jit/fi" \
    "+serve.env.TRITON_CACHE_DIR=$jit/triton" \
    "serve.extra_args=[--attention-backend,triton,--sampling-backend,pytorch,--grammar-backend,none,\
--mm-feature-transport,cpu]" serve.mem_fraction_static=0.4 serve.cuda_graph_max_bs=16 serve.startup_timeout_s=480 \
    "bench.sglang_grid=${GRID:-[[3,1],[4,2,8]]}" bench.grid_prompts=30 serve.sglang_version=0.5.17
  [ "${TRAIN_ONLY:-0}" = 1 ] && echo "stages=[generate,extract,train]"
  [ "${BENCH_ONLY:-0}" = 1 ] && echo "stages=[generate,bench]"
  # results.json keeps every metric; MLflow records them too where the machine has it
  python3 -c "import mlflow" 2> /dev/null || echo tracking.enabled=false
}

run() {  # run OVERRIDE...: src/run.py with the run's overrides, then these, then EXTRA
  local args
  mapfile -t args < <(overrides)
  # shellcheck disable=SC2086  # EXTRA is words
  (cd "$code" && PYTHONPATH=src:$G/site-dl python3 src/run.py "${args[@]}" "$@" ${EXTRA:-} < /dev/null)
}

pipeline() {  # the detached job: one src/run.py, so its preflight checks the bench's needs before training
  gpu_wait_smollm2 "$G" || return 1
  run && { pack_train; return 0; }
  pack_train || return 1  # no draft: the failure came before the bench, and a second run would repeat it
  echo "bench: failed with CUDA graphs; once more without them"
  run serve.cuda_graph=false
}

pack_train() {  # the train stage's folder, to keep: `DRAFT=1 collect` brings it back, BENCH_ONLY=1 benches it
  local record folder
  # the completion record is written last: without it training has not ended, and no partial archive is left
  record=$(ls "$G"/root/train/*/.done/*.json 2> /dev/null | head -n 1)
  [ -n "$record" ] || { echo "train: no completed folder under $G/root/train"; return 1; }
  folder=$(dirname "$(dirname "$record")")
  tar -czf "$G/train.tgz.tmp" -C "$G/root" --exclude=checkpoints "train/$(basename "$folder")" \
    && mv "$G/train.tgz.tmp" "$G/train.tgz" && echo "train: packed $folder"
}

start() {  # SGLang's site first: the run's preflight asks the server's python for sglang
  [ -d "$G/sglang-site/sglang" ] || [ "${TRAIN_ONLY:-0}" = 1 ] \
    || { echo "sglang: no site unpacked; stage .gpu-stage/sglang and install"; return 1; }
  [ "${BENCH_ONLY:-0}" = 1 ] && [ ! -d "$G/root/train" ] \
    && { echo "train: no folder carried; stage .gpu-stage/train/ (DRAFT=1 collect's parts) and install"; return 1; }
  gpu_start "$G" "bash benchmarks/gpu/serve.sh pipeline"
}

watch() {
  gpu_wait "$G"
  grep -ah "stage \|sglang\|grid\|Error\|tau" "$G/log.txt" 2> /dev/null | grep -v "it/s\]" | tail -n 25
  collect
}

collect() {
  [ -n "${OUT:-}" ] || return 0
  if [ -d "$G/root/bench" ]; then  # every bench run (a failed one's server log says why); logs cut to their
    # last 200 kB: the phases and the errors are at the ends
    (cd "$G/root/bench" && for f in */*.log; do [ -f "$f" ] && tail -c 200000 "$f" > "$f.tail"; done
     tar -czf "$OUT/bench.tgz" --exclude='*.log' --exclude=generations.jsonl . )
  fi
  find "$G/root" "$code/outputs" -name results.json -newer "$G/code" -print0 2> /dev/null \
    | tar -czf "$OUT/results.tgz" --null -T - 2> /dev/null
  if [ "${DRAFT:-0}" = 1 ]; then  # packed now if the bench is still running: a trained draft outlives the machine
    [ -f "$G/train.tgz" ] || pack_train
    [ -f "$G/train.tgz" ] && split -b 15000000 -d "$G/train.tgz" "$OUT/train.tgz.part-"
  fi
  gpu_log_out "$G"
}

step=${1:?usage: serve.sh install|start|watch|collect|pipeline}
shift
"$step" "$@"

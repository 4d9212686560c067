#!/usr/bin/env bash
# Issue 11 part 2 on one H200: generation with data.generator=plain, graphs (refill 0.25, and 1.0 = fixed batches)
# and static, in one process on the same 2,048 ShareGPT prompts (128 new tokens, 512 rows, bf16); then graphs with
# its step compiled by torch.compile, and the generate stage itself. BENCHMARKS.md
# "Generation with CUDA graphs" is filled from what comes back: $OUT/generate.jsonl (one JSON line per run),
# $OUT/generate.log, and $OUT/stage.log (the generate stage itself, hardware=gpu data.generator=graphs, 2,048 samples).
#
# A device call carries at most 64 MiB and SmolLM2's GGUF is 98 MB, so it travels in two halves (.gguf-a/, .gguf-b/:
# `split -b 50m`; see bench/h200_session.sh). Two calls on one warm machine (it stays warm ~30 s after a call):
#   call 1, seconds   (carry .whl .whl-tf .gguf-a .speed/site .speed/prompts.jsonl): bash bench/h200_generate.sh install
#   call 2, <5 min    (carry .gguf-b):                                               bash bench/h200_generate.sh run
# A machine on which another script's install step already ran (/tmp/gg.aa and /tmp/site there) needs call 2 only;
# carry the prompts then too, or set PROMPTS. .speed/prompts.jsonl is `bench/export_prompts.py --count 4096`.
set -uo pipefail
step=${1:?usage: h200_generate.sh install|run}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src
. bench/gpu_machine.sh  # install_wheels, keep_first_half, smollm2_gguf
ROOT=/tmp/dl  # the converted SmolLM2 lands in $ROOT/models and is reused by later calls on this machine
case "$step" in
install)
  install_wheels .whl .whl-tf && keep_first_half || exit 1
  # the prompts may come with either call (call 1 is near the 64 MiB limit: 62.7 MiB with them)
  [ -f "${PROMPTS:-.speed/prompts.jsonl}" ] && cp "${PROMPTS:-.speed/prompts.jsonl}" /tmp/prompts.jsonl
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  echo "installed; now call 2: bash bench/h200_generate.sh run (carry .gguf-b)" ;;
run)
  smollm2_gguf || { echo "run 'bash bench/h200_generate.sh install' first (same machine)"; exit 1; }
  prompts=${PROMPTS:-/tmp/prompts.jsonl}
  [ -f "$prompts" ] || prompts=.speed/prompts.jsonl
  [ -f "$prompts" ] || { echo "no prompts: carry .speed/prompts.jsonl (bench/export_prompts.py) or set PROMPTS"; exit 1; }
  mkdir -p $ROOT "$OUT"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT"/generate.log
  # plain first: it is the reference for match_vs_plain; each path runs twice (the first run includes static's
  # ~40 s compile and graphs' capture). A path that fails logs its error and the others still run.
  timeout --signal=TERM --kill-after=5 180 python3 bench/generate_speed.py --prompts "$prompts" --count 2048 \
    --device cuda --dtype bfloat16 --batch-size 512 --max-new-tokens 128 --max-prompt-tokens 256 \
    --paths plain graphs static --refill 0.25 1.0 --repeats 2 --root $ROOT --json "$OUT"/generate.jsonl \
    2>&1 | grep -v -i -E 'warn|it/s\]' | tee -a "$OUT"/generate.log
  echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT"/generate.log
  # graphs-compiled: inductor fuses the step's small kernels before capture (an option, not the stage's path);
  # its own process, so that a compile problem costs nothing above
  timeout --signal=TERM --kill-after=5 90 python3 bench/generate_speed.py --prompts "$prompts" --count 2048 \
    --device cuda --dtype bfloat16 --batch-size 512 --max-new-tokens 128 --max-prompt-tokens 256 \
    --paths graphs-compiled --refill 0.25 --repeats 2 --root $ROOT --json "$OUT"/generate.jsonl 2>&1 \
    | grep -v -i -E 'warn|it/s\]' | tail -20 | tee -a "$OUT"/generate.log
  # the stage itself with the preset and graphs: 2,048 samples (one shard), seconds and tok/s from its results.json
  timeout --signal=TERM --kill-after=5 30 python3 src/run.py hardware=gpu data.generator=graphs data.samples=2048 \
    data.source=jsonl data.path="$(realpath "$prompts")" paths.root=$ROOT tracking.enabled=false \
    hydra.run.dir=$ROOT/graphs_stage 'stages=[generate]' > "$OUT"/stage.log 2>&1
  echo "stage rc=$?" | tee -a "$OUT"/generate.log
  grep -h -o '"generate/[a-z_]*": [0-9.e+-]*' $ROOT/graphs_stage/results.json | tee -a "$OUT"/generate.log
  grep -h 'graphs:' "$OUT"/stage.log | tee -a "$OUT"/generate.log
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | tee -a "$OUT"/generate.log ;;
*) echo "usage: h200_generate.sh install|run"; exit 2 ;;
esac

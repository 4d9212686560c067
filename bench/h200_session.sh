#!/usr/bin/env bash
# What ran on the lent H200 for BENCHMARKS.md and docs/data_scaling.md, in the order it ran. The device machine
# reaches no package index or model hub, so what it needs travels with the call (see the README of the device
# tool): wheels in .whl/ and .whl-tf/, SmolLM2's GGUF in two halves (.gguf-a/, .gguf-b/: `split -b 50m`), and the
# ShareGPT prompts as JSONL in .gpu/ (the 125 MB JSON is too large to carry; `bench/export_prompts.py` writes it).
# Jobs run with tracking.enabled=false and leave results.json beside each Hydra job; `python -m draftlab
# import-runs` logs them into the local MLflow store afterwards.
set -euo pipefail
step=${1:?usage: h200_session.sh install|sweep|extract-bench|draft}
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
. bench/gpu_machine.sh  # install_wheels, keep_first_half, smollm2_gguf
ROOT=/tmp/dl
case "$step" in
install)   # call 1: wheels, and the first half of the GGUF
  install_wheels .whl && keep_first_half ;;
sweep|draft)  # call 2 (and 3, which resumes a sweep: every finished stage is cached)
  install_wheels .whl-tf && smollm2_gguf || exit 1
  mkdir -p $ROOT && cp -n .gpu/sharegpt_prompts.jsonl $ROOT/ 2>/dev/null || true
  gpu=(paths.root=$ROOT tracking.enabled=false data.source=jsonl data.path=$ROOT/sharegpt_prompts.jsonl
       data.batch_size=512 data.shard_size=1024 extract.batch_size=64 extract.shard_size=512 train.batch_tokens=16384)
  if [ "$step" = sweep ]; then
    python3 src/run.py -m experiment=data_scaling "${gpu[@]}" bench.prompts=8 \
      data.samples=6400,3200,1600,800,400,200 train.seed=0 hydra.sweep.dir=$ROOT/sweep
  else  # a draft trained on more data, brought back in pieces for the CPU benchmark
    python3 src/run.py "${gpu[@]}" data.samples=${SAMPLES:-3200} 'stages=[generate,extract,train]' \
      data.max_new_tokens=128 hydra.run.dir=$ROOT/draft_run
    draft=$(ls -d $ROOT/train/*/draft | head -1)
    cp $draft/config.json $ROOT/draft_run/results.json "$OUT"/
    split -b 15m $draft/model.safetensors "$OUT"/model.safetensors.part-
  fi ;;
extract-bench)
  python3 bench/extract_vs_forward.py --device cuda --target smollm2 --dtype bfloat16 --samples 1024 \
    --batch-size 64 --shard-size 256 --root $ROOT/xbench ;;
esac

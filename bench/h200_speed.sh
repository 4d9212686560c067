#!/usr/bin/env bash
# What ran on the lent H200 for BENCHMARKS.md "The GPU path at real scale" (issue 11), as steps. Run from the root
# of a checkout of today's code (main: its own src/ and bench/ are the baseline) that carries, as ignored folders:
#   .whl/    transformers 5.24.0, gguf 0.19.0, hydra-core 1.3.8, omegaconf 2.3.1 wheels
#   .speed/  site/antlr4 (antlr4-python3-runtime 4.9.3, pure Python, copied from a venv), prompts.jsonl (4,096
#            ShareGPT prompts: bench/export_prompts.py .speed/prompts.jsonl --count 4096), wt/{src,bench,conf} (the
#            code under test)
#   .gguf-a/gg.aa, .gguf-b/gg.ab   SmolLM2's GGUF split in two (`split -b 47m`): a call carries at most 64 MiB, so
#            `install` carries .whl + .gguf-a and the next call (same warm machine, within 30 s) carries .gguf-b
set -uo pipefail
step=${1:?usage: h200_speed.sh install|train|generate|extract|e2e}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
. bench/gpu_machine.sh  # install_wheels, keep_first_half, smollm2_gguf
W=.speed/wt
R=/tmp/dl
OUT=${OUT:-/tmp/out}
mkdir -p $OUT $R
case "$step" in
install)
  install_wheels .whl && keep_first_half ;;
train)  # training throughput: today's bench + code against the branch's, same machine, same call
  { for bt in 4096 32768; do python3 bench/train_throughput.py --preset smollm2 --batch-tokens $bt | sed 's/^{/{"code": "main", /'; done
    for bt in 4096 16384 32768 65536; do python3 $W/bench/train_throughput.py --preset smollm2 --batch-tokens $bt | sed 's/^{/{"code": "speed", /'; done
    python3 $W/bench/train_throughput.py --preset smollm2 --batch-tokens 32768 --targets full | sed 's/^{/{"code": "speed", /'
    python3 bench/train_throughput.py --preset llama8b --batch-tokens 4096 | sed 's/^{/{"code": "main", /'
    for bt in 4096 16384; do python3 $W/bench/train_throughput.py --preset llama8b --batch-tokens $bt | sed 's/^{/{"code": "speed", /'; done
  } 2>&1 | tee $OUT/train_throughput.jsonl ;;
generate)
  smollm2_gguf
  PYTHONPATH=/tmp/site:$W/src python3 $W/bench/generate_speed.py --prompts .speed/prompts.jsonl --count 2048 --device cuda \
    --dtype bfloat16 --batch-size 512 --max-new-tokens 128 --paths plain static continuous --repeats 2 --root $R 2>&1 \
    | grep '^{' | tee $OUT/generate_speed.txt ;;
extract)
  smollm2_gguf
  for code in main speed; do
    src=src; [ $code = speed ] && src=$W/src
    PYTHONPATH=/tmp/site:$src python3 bench/extract_vs_forward.py --device cuda --target smollm2 --dtype bfloat16 \
      --samples 1024 --batch-size 64 --shard-size 256 --root $R 2>&1 | grep '^{' | sed "s/^{/{\"code\": \"$code\", /"
  done | tee $OUT/extract_vs_forward.jsonl ;;
e2e)  # SAMPLES=3500 fits the 4,096 carried prompts; 50,000 needs the full JSONL (bench/h200_session.sh's .gpu/)
  smollm2_gguf
  python3 $W/src/run.py hardware=gpu data.samples=${SAMPLES:-3500} data.source=jsonl data.path=$PWD/.speed/prompts.jsonl \
    paths.root=$R tracking.enabled=false hydra.run.dir=$R/run ${EXTRA:-} > $OUT/e2e.log 2>&1
  cp $R/run/results.json $OUT/e2e_results.json ;;
esac

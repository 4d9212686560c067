#!/usr/bin/env bash
# The data-scaling sweeps of conf/experiment/data_scaling_gpu.yaml (docs/data_scaling.md is their report) on one GPU
# machine without internet, in steps, from the repository root with .gpu-stage/ in it (benchmarks/gpu/stage.sh;
# install runs again as more of it arrives, such as the GGUF's second half: benchmarks/gpu/README.md):
#   bash benchmarks/gpu/data_scaling.sh install   # benchmarks/gpu/machine.sh; the code copied to $G/code (first time)
#   bash benchmarks/gpu/data_scaling.sh start PART...  # the pool's first shard, then the PARTs' sweeps one after
#                                            # another, detached; a part is about half an hour of jobs: a = the
#                                            # header's first (3 sizes x 2 seeds), b = the next two (3 sizes, the
#                                            # steps probe), c = the ablations; all = every one; or sweep numbers
#                                            # (4,5). PART:OVERRIDES adds overrides to its sweeps:
#                                            # '1:data.samples=6400' runs the first sweep's 6400-sample jobs
#   bash benchmarks/gpu/data_scaling.sh watch     # progress every minute until they end or BUDGET s (540), then
#                                            # collect
#   bash benchmarks/gpu/data_scaling.sh collect   # $OUT/sweeps.tgz (every job's results.json, config and log),
#                                            # log.txt and pool.tgz: the pool's first shard (the validation set in
#                                            # it), which install unpacks from .gpu-stage/pool/pool.tgz; the log
#                                            # says how many committed runs share its validation answers
# The sweeps are read from the experiment file's header, so the two cannot drift apart. Each runs with the joblib
# launcher, JOBS (2) jobs side by side (docs/scale.md), tracking off: the records come back in results.json, and
# benchmarks/gpu/README.md's last commands turn them into the report.
# Environment: G (/tmp/data-scaling), JOBS, BUDGET, GGUF_WAIT (1200 s), DRAFTLAB_GIT_COMMIT (recorded by every
# job); for a dry run elsewhere, EXTRA (overrides after the sweep's own, e.g. target=tiny hardware=cpu).
set -uo pipefail
G=${G:-/tmp/data-scaling}
here=$(cd "$(dirname "$0")" && pwd)
code=$G/code
export PYTHONUNBUFFERED=1
. "$here/machine.sh"

install() { gpu_install .gpu-stage "$G" && install_pool; }

install_pool() {  # a staged pool prefix (.gpu-stage/pool/pool.tgz, an earlier machine's) -> the jobs' pool
  local tgz=.gpu-stage/pool/pool.tgz
  [ -f "$tgz" ] || return 0
  mkdir -p "$G/dl/generate" && tar -xzf "$tgz" --skip-old-files -C "$G/dl/generate" || return 1
  tar -tzf "$tgz" | head -n 1 | cut -d/ -f1 > "$G/pool-carried"
  echo "pool: $(cat "$G/pool-carried") carried"
}

pools() {  # the generate pools made so far, a key a line: the folders with a manifest (not the stage's <key>.lock)
  local manifest
  for manifest in "$G"/dl/generate/*/manifest.json; do
    [ -f "$manifest" ] && basename "$(dirname "$manifest")"
  done
  return 0
}

pool_out() {  # this machine's pool: its validation answers against the committed runs' (once), and its first shard
  # as $OUT/pool.tgz (made once), for a later machine's install
  # the records come from the repository root it runs in: the code copy leaves benchmarks/results out (machine.sh)
  local keys records=$PWD/benchmarks/results/data_scaling/records.jsonl.gz
  keys=$(pools)
  [ -n "$keys" ] && [ "$(wc -l <<< "$keys")" = 1 ] || return 0  # none yet, or not one pool: nothing to say or send
  local pool=$G/dl/generate/$keys
  if [ ! -f "$G/pool-compared" ] && [ -f "$records" ]; then
    (cd "$code" && PYTHONPATH=src:$G/site-dl python3 benchmarks/gpu/pool_prefix.py "$pool" --compare "$records") \
      > "$G/pool-compared" || rm -f "$G/pool-compared"
  fi
  [ -f "$G/pool-compared" ] && awk -v say="pool: validation answers of other lengths than the committed runs':" \
    '{n[$2]++} END {printf "%s", say; for (d in n) printf " %s in %d runs;", d, n[d]; print ""}' "$G/pool-compared"
  [ -e "$G/pool-carried" ] && return 0  # the jobs extend a staged pool: its prefix is already here
  if [ ! -f "$G/pool.tgz" ]; then
    rm -rf "$G/prefix" && mkdir -p "$G/prefix"
    (cd "$code" && PYTHONPATH=src:$G/site-dl python3 benchmarks/gpu/pool_prefix.py "$pool" "$G/prefix") || return 0
    tar -czf "$G/pool.tmp" -C "$G/prefix" "${pool##*/}" && mv "$G/pool.tmp" "$G/pool.tgz"
  fi
  cp "$G/pool.tgz" "$OUT/pool.tgz"
}

sweeps() {  # the overrides of the header's commands, one line each
  sed -n 's/^#   python src\/run.py -m experiment=data_scaling_gpu *//p' "$code/conf/experiment/data_scaling_gpu.yaml" \
    | sed 's/ *#.*$//'
}

part() {  # part PART: the numbers of PART's sweeps, in the header's order
  local n
  n=$(sweeps | wc -l)
  case $1 in
    a) echo 1 ;;
    b) seq 2 3 ;;
    c) seq 4 "$n" ;;
    all) seq 1 "$n" ;;
    *) local k ok=0
       if [[ $1 =~ ^[0-9]+(,[0-9]+)*$ ]]; then
         ok=1
         for k in ${1//,/ }; do ((k >= 1 && k <= n)) || ok=0; done
       fi
       [ "$ok" = 1 ] || { echo "PART: a, b, c, all or sweep numbers 1-$n (e.g. 4,5), not $1" >&2; return 2; }
       tr , '\n' <<< "$1" | sort -nu ;;
  esac
}

run_parts() {  # run_parts PART...: each part's sweeps in order (start checked them); a failed sweep stops the rest
  local spec
  gpu_wait_smollm2 "$G" || return 1
  make_pool || return 1
  for spec in "$@"; do
    if [[ $spec == *:* ]]; then run_part "${spec%%:*}" "${spec#*:}" "-${spec//[^0-9a-z]/_}"; else run_part "$spec"; fi \
      || return 1
  done
}

first_shard() {  # the samples that fill the pool's first shard, the one the validation set opens: data.shard_size
  # less data.val_samples, read from the experiment as Hydra composes it (hardware=gpu's shards)
  (cd "$code" && PYTHONPATH=src:$G/site-dl python3 src/run.py experiment=data_scaling_gpu --cfg job --package data) \
    | awk '/^shard_size:/ {s = $2} /^val_samples:/ {v = $2} END {if (s == "" || v == "") exit 1; print s - v}'
}

make_pool() {  # the pool's first shard alone first, so every machine answers it whole and alike; the jobs add the
  local n  # rest (the records' generate code answered a first shard cut at a smaller size apart: README.md here)
  n=$(first_shard) || { echo "pool: could not read data.shard_size and data.val_samples"; return 1; }
  echo "pool: generating $n samples first (the first shard: the validation set's)"
  multirun "$G/pool-job" "data.samples=$n" train.seed=0 'stages=[generate]' || return 1
  check_carried
}

check_carried() {  # a staged pool this commit's jobs did not extend (another generate key) is not theirs: say so
  [ -s "$G/pool-carried" ] || return 0
  local key
  key=$(cat "$G/pool-carried")
  [ "$(pools)" = "$key" ] && { echo "pool: the jobs extend the carried $key"; return 0; }
  echo "pool: WARNING: the jobs made their own pool, not the carried $key: their validation answers are their own"
  rm -rf "${G:?}/dl/generate/$key"{,.lock} "$G/pool-carried"  # this machine's own pool is sent as pool.tgz instead
}

run_part() {  # run_part PART [OVERRIDES [DIR_SUFFIX]]: PART's sweeps, OVERRIDES after each sweep's own
  local k=0 overrides chosen
  chosen=" $(part "$1" | tr '\n' ' ')" || return 2
  while IFS= read -r overrides; do
    k=$((k + 1))
    [[ $chosen == *" $k "* ]] || continue
    echo "sweep $k: $overrides${2:+ $2}"
    # shellcheck disable=SC2086  # the header's overrides are words
    multirun "$G/sweeps/s$k${3:-}" $overrides ${2:-} hydra/launcher=joblib hydra.launcher.n_jobs="${JOBS:-2}" \
      || return 1
  done < <(sweeps)
}

multirun() {  # multirun SWEEP_DIR OVERRIDE...: the experiment on the staged prompts, untracked, EXTRA last
  local dir=$1
  shift
  # shellcheck disable=SC2086  # EXTRA is words
  (cd "$code" && PYTHONPATH=src:$G/site-dl python3 src/run.py -m experiment=data_scaling_gpu "$@" \
    data.source=jsonl "data.path=$G/carried/prompts.jsonl" tracking.enabled=false "paths.root=$G/dl" \
    "hydra.sweep.dir=$dir" ${EXTRA:-} < /dev/null)  # not the caller's stdin: run_part's holds the sweeps to run
}

start() {
  (($#)) || { echo "start: PART... (a, b, c, all, sweep numbers; PART:OVERRIDES)" >&2; return 2; }
  local spec
  for spec in "$@"; do part "${spec%%:*}" > /dev/null || return 2; done  # refused now, not in the detached job
  # the copy's script: a checkout changed meanwhile may replace this file while bash still reads it
  gpu_start "$G" "bash benchmarks/gpu/data_scaling.sh run_parts $(printf '%q ' "$@")"
}

watch() {
  gpu_wait "$G"
  grep -h "^sweep \|verdict\|Error" "$G/log.txt" 2> /dev/null | tail -n 20
  echo "jobs with results: $(find "$G/sweeps" -name results.json 2> /dev/null | wc -l)"
  collect
}

collect() {
  [ -n "${OUT:-}" ] || return 0
  (cd "$G" && find sweeps \( -name results.json -o -name '*.log' -o -path '*/.hydra/*.yaml' \) -print0 2> /dev/null \
    | tar -czf "$OUT/sweeps.tgz" --null -T -)
  pool_out
  gpu_log_out "$G"
}

step=${1:?usage: data_scaling.sh install|start PART...|watch|collect|part PART|sweeps|first_shard}
shift
"$step" "$@"

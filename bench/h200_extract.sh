#!/usr/bin/env bash
# Issue 11 part 3: where extraction's time goes on one nvidia-h200 (BENCHMARKS.md "Left to run", extraction at
# 1.92x a plain forward, goal 1.1x). One call, from the repository root, carrying .whl and .whl-tf (no GGUF: the
# target is a random Llama of SmolLM2's shape, whose forward costs what the real one does):
#   bash bench/h200_extract.sh
#   DISK=0 bash bench/h200_extract.sh   (no dd and no disk variant: the disk's write-back, which runs on after a
#     write and slowed the next variant by up to 1.9x, then disturbs nothing; five repeats)
#   (after h200_headline.sh's install and wheels calls on the same warm machine, a call carrying nothing does)
#   SAMPLES=32768 REPEATS=3 VARIANTS="forward_head forward_read extract_null_w4 extract_shm_w4" WRITERS=4 TMPFS=0 DISK=0 \
#     bash bench/h200_extract.sh   (about 5 minutes)
#     (32 shards: the last shard's write, which nothing overlaps, then weighs 1/32, near the stage's 1/49 at
#      50,000 samples, not 1/8 as at the default 8,192; BATCH sets --batch-size, 64 as the GPU preset)
# It prints the machine's disk facts and a sequential write's speed (dd, 16 GB: more than the page cache holds
# dirty), then bench/extract_vs_forward.py's parts (forward, forward_head, extract_host, extract_null (the writer's
# pipeline without the file), extract, extract_shm and extract_shm_raw (a plain write of the same bytes) when
# /dev/shm has room; each writing variant with WRITERS writer threads, default "1 4"). What comes back:
# $OUT/extract_parts.jsonl, $OUT/tmpfs_write.jsonl and $OUT/disk.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1 SITE=/tmp/site
. "$(dirname "$0")/gpu_machine.sh"  # install_wheels, keep_first_half, shm_has_room
ROOT=${ROOT:-/tmp/dl}
mkdir -p "$ROOT" "$OUT"
install_wheels .whl .whl-tf && keep_first_half || exit 1

[ "${DISK:-1}" = 1 ] && {
  nvidia-smi -L; nproc; free -g | head -n 2
  df -hT /tmp /dev/shm; findmnt -T /tmp -o TARGET,SOURCE,FSTYPE,OPTIONS | cut -c1-160
  echo "dirty_ratio $(cat /proc/sys/vm/dirty_ratio) dirty_background_ratio $(cat /proc/sys/vm/dirty_background_ratio)"
  echo "# dd 16 GB, no sync (page cache, then throttled to the disk):"
  dd if=/dev/zero of="$ROOT/dd.bin" bs=64M count=256 2>&1 | tail -n 1
  rm -f "$ROOT/dd.bin"
  echo "# dd 4 GB with fdatasync (what reaches the disk):"
  dd if=/dev/zero of="$ROOT/dd.bin" bs=64M count=64 conv=fdatasync 2>&1 | tail -n 1
  rm -f "$ROOT/dd.bin"
  sync
} 2>&1 | tee "$OUT/disk.txt"

# tmpfs's write speed from 1 to 8 threads, safetensors' and a plain write's, the main thread idle and busy in Python
# (about a minute; TMPFS=0 leaves it out): $OUT/tmpfs_write.jsonl
[ "${TMPFS:-1}" = 1 ] && PYTHONPATH=$SITE timeout 150 python3 bench/tmpfs_write.py --folder /dev/shm --pinned \
  --repeats 2 | tee -a "$OUT/tmpfs_write.jsonl" | cut -c1-1500

flags=(--repeats ${REPEATS:-3}); [ "${DISK:-1}" = 1 ] || flags=(--repeats ${REPEATS:-5} --no-disk)
# the synthetic samples' shards: about 900 kB a sample (192 tokens of 4,617 bytes); without the room the shm variants
# are left out, and a VARIANTS naming one fails
shm=()
if shm_has_room ${SAMPLES:-8192} 900; then shm=(--shm)
elif [[ " ${VARIANTS:-} " == *" extract_shm"* ]]; then exit 1
fi
variants=(); [ -n "${VARIANTS:-}" ] && variants=(--variants $VARIANTS)
PYTHONPATH=$SITE:src timeout 420 python3 bench/extract_vs_forward.py --device cuda --target shaped \
  --dtype bfloat16 --samples "${SAMPLES:-8192}" --batch-size ${BATCH:-64} --shard-size 1024 "${shm[@]}" \
  --writers ${WRITERS:-1 4} "${variants[@]}" "${flags[@]}" --root "$ROOT" >> "$OUT/extract_parts.jsonl" \
  2> "$OUT/extract_parts.err"
echo "rc=$?"; tail -n 3 "$OUT/extract_parts.err" | cut -c1-300
python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).readlines()[-1]); print(json.dumps({k: r[k] for k in \
  ('tokens', 'safetensors', 'torch', 'ratios_to_forward', 'tok_s', 'tok_s_runs', 'bytes_per_token')}, indent=1))" \
  "$OUT/extract_parts.jsonl"

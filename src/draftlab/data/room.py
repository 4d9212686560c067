"""Whether a pool's next writes fit where it lives, asked before the work that would fill it.

A full disk in the middle of extraction loses the minutes spent so far, and a full tmpfs (`extract.pool_root` in
/dev/shm) is worse: its pages are memory, so the host swaps or the OOM killer picks a process. tmpfs reports the
free space of its size limit (half the RAM by default, often more), not the memory that is actually available,
so for tmpfs the smaller of the two counts.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


def filesystem_type(path: Path, mounts: Path = Path("/proc/mounts")) -> str:
    """The type of the filesystem holding `path` (the longest mount point above it in `mounts`); '' when
    unknown (no /proc, as on macOS)."""
    path = Path(os.path.realpath(path))
    best, fstype = "", ""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, fstype = mount, fields[2]
    return fstype


def available_memory(cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes of memory this process can still fill: MemAvailable from /proc/meminfo, lowered to the cgroup v2
    limit's headroom (memory.max - memory.current) in a container, where tmpfs pages count against that limit.
    None where neither is known."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            found.append(max(0, int(limit) - int((cgroup / "memory.current").read_text())))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def free_bytes(path: Path) -> tuple[int, bool]:
    """(bytes that can still be written under `path`, whether they are memory). `path` must exist."""
    fstype = filesystem_type(path)
    if fstype not in MEMORY_FILESYSTEMS:
        return shutil.disk_usage(path).free, False
    # ramfs has no size limit and reports 0 free; tmpfs reports its limit's headroom
    free = shutil.disk_usage(path).free if fstype == "tmpfs" else None
    memory = available_memory()
    known = [b for b in (free, memory) if b is not None]
    return (min(known) if known else 0), True


# What a pool stores besides the two hidden-state tensors (data/samples.py `pack`, stages/extract.py): per token
# target_top (int32), input_ids (int32) and loss_mask (uint8); per sample offsets and sample_index (int64) and split.
ID_BYTES_PER_TOKEN = 4 + 4 + 1
BYTES_PER_SAMPLE = 8 + 8 + 1
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
ROOM_MARGIN = 1 << 30  # bytes kept free beyond the estimate: the manifest, the vocab, a filesystem's own use


def bytes_per_token(dtype: str, feature_width: int, hidden_size: int) -> int:
    """What one stored token takes in an extract pool: the features and the last hidden state in `dtype`, and ids."""
    return (feature_width + hidden_size) * ITEMSIZE[dtype] + ID_BYTES_PER_TOKEN


def estimated_bytes_per_token(manifest: dict) -> float:
    """What a stored token takes: the pool's own average once it has shards, else its tensors' widths."""
    if manifest["bytes_per_token"]:
        return float(manifest["bytes_per_token"])
    return float(bytes_per_token(manifest["dtype"], manifest["shapes"]["features"][1],
                                 manifest["shapes"]["last_hidden"][1]))


def room_needed(tokens: int, samples: int, per_token: float, in_memory: bool, shard_size: int, writers: int) -> int:
    """Bytes an extraction of `tokens` needs free where the pool lives. A pool in memory also shares it with the
    pinned staging buffers: `writers` + 1 shards in flight, each tensor in a block rounded up to a power of two by
    torch's pinned-memory cache, so up to twice a shard's bytes each."""
    need = int(tokens * per_token) + ROOM_MARGIN
    if in_memory and samples:
        shard_bytes = tokens / samples * min(shard_size, samples) * per_token
        need += int(2 * (writers + 1) * shard_bytes)
    return need

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


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def free_bytes(path: Path) -> tuple[int, bool]:
    """(bytes that can still be written under `path`, whether they are memory). `path` must exist."""
    free = shutil.disk_usage(path).free
    in_memory = filesystem_type(path) in MEMORY_FILESYSTEMS
    if in_memory:
        memory = available_memory()
        if memory is not None:
            free = min(free, memory)
    return free, in_memory

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

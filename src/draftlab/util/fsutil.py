"""Atomic writes and file locks: nothing half-written is ever read, two runs never corrupt a shared folder."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

# mkstemp makes its file 0600; a renamed one gets the mode open() would give, so a shared cache stays readable.
# Read once at import: os.umask can only be read by setting it, which is not safe beside the writer threads.
_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yields a temporary path beside `path`; renames it over `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except OSError as err:
        if err.filename:  # already names its file
            raise
        # A write error (disk full, file too large) names no file by itself: name the one being written.
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_save_safetensors(path: Path, tensors: dict, metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        try:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        except Exception as err:  # safetensors reports I/O failures as SafetensorError("... (os error N)")
            code = re.search(r"os error (\d+)", str(err))
            if code is None:
                raise
            errno_ = int(code.group(1))
            raise OSError(errno_, os.strerror(errno_), str(path)) from err
        if metadata and len(metadata) > 1:
            _sort_metadata(tmp)


def _sort_metadata(path: Path) -> None:
    """safetensors writes `__metadata__` in Rust HashMap order, which changes from process to process: the same
    tensors would give other bytes (and another DVC hash). Rewrites the header with the metadata sorted; the
    length is unchanged, so only the header bytes move."""
    import struct

    with open(path, "r+b") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        raw = handle.read(length)
        header = json.loads(raw)
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        new = json.dumps(header, separators=(",", ":")).encode()
        if len(new) > length:  # never: same keys, same values, compact JSON
            raise ValueError(f"{path}: header grew when its metadata was sorted")
        handle.seek(8)
        handle.write(new + b" " * (length - len(new)))


def atomic_write_with(path: Path, write: Callable[[Path], None]) -> None:
    """Calls `write(tmp_path)` and moves the result into place."""
    with atomic_path(path) as tmp:
        write(tmp)


@contextlib.contextmanager
def leftovers_removed(parent: Path, pattern: str) -> Iterator[None]:
    """Removes `pattern` under `parent` (what a killed writer left) now, and again if the block fails (what a
    failing writer, e.g. on a full disk, left). Use it where no other writer of `parent` runs."""
    remove_leftovers(parent, pattern)
    try:
        yield
    except BaseException:
        remove_leftovers(parent, pattern)
        raise


def remove_leftovers(parent: Path, pattern: str, recursive: bool = False) -> None:
    """Removes what a killed writer left (`pattern`, e.g. `.ckpt-*.tmp`), in sub-folders too when `recursive`.
    Call it where no other writer of `parent` can run (under its lock, or as its only writer)."""
    found = Path(parent).rglob(pattern) if recursive else Path(parent).glob(pattern)
    for stale in sorted(found, key=lambda p: len(p.parts)):  # outer first: rmtree takes what is inside
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        elif stale.exists():
            stale.unlink(missing_ok=True)


def read_json(path: Path, default: Any = None) -> Any:
    path = Path(path)
    if not path.exists():
        return default
    return json.loads(path.read_text())


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if needed), released when the block ends or the process dies."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def remembered(cache: Path, key: str, family: str, compute: Callable[[], Any]) -> Any:
    """`compute()`, remembered in the JSON file `cache` under `key`; older keys of the same `family` prefix are
    dropped. Only a cache: a concurrent writer may win, and a read-only disk only costs a recomputation."""
    try:
        known = json.loads(Path(cache).read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        known = {k: v for k, v in known.items() if not k.startswith(family)}
        known[key] = compute()
        try:
            atomic_write_json(Path(cache), known)
        except OSError:
            pass
    return known[key]


WRITER_FILE = ".draftlab_writer.json"  # in a folder a command wrote: which command, and the files it wrote


class DestinationError(ValueError):
    """A destination folder holds what the command did not write: replacing it would lose it."""


def check_destination(dst: Path, writer: str, force: bool = False, own_names: tuple[str, ...] = ()) -> None:
    """Refuses `dst` unless it is absent, an empty folder, or holds only files `writer` wrote there (its
    WRITER_FILE record; `own_names`: what an older `writer` left without a record). `force` accepts anything:
    owned_folder then swaps a new folder in whole."""
    dst = Path(dst)
    if force or not os.path.lexists(dst):
        return
    if not dst.is_dir():
        raise DestinationError(f"{dst}: is a file, not a folder; pass --force to replace it")
    present = sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file() or p.is_symlink())
    record = read_json(dst / WRITER_FILE, None) if (dst / WRITER_FILE).is_file() else None
    if isinstance(record, dict) and record.get("writer") == writer:
        own = set(record.get("files") or ()) | {WRITER_FILE}
    else:
        own = set(own_names) if record is None else set()
    foreign = [name for name in present if name not in own]
    if foreign or (present and not own):
        shown = ", ".join((foreign or present)[:4]) + (" ..." if len(foreign or present) > 4 else "")
        raise DestinationError(f"{dst}: holds files {writer} did not write ({shown}); pass --force to replace "
                               "the folder, or name a new one")


@contextlib.contextmanager
def owned_folder(dst: Path, writer: str, force: bool = False, own_names: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yields a new folder beside `dst` to write into; when the block succeeds it records what was written
    (WRITER_FILE) and is swapped in for `dst` whole, so `dst` is never half written or mixed with older files.
    check_destination first: nothing the writer did not write is replaced unless `force`."""
    dst = Path(dst)
    check_destination(dst, writer, force, own_names)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent))
    old = dst.parent / f".{dst.name}.old-{os.getpid()}.tmp"  # `.*.tmp`: the pipeline's leftover sweep takes it
    try:
        yield tmp
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
        atomic_write_json(tmp / WRITER_FILE, {"writer": writer, "files": files})
        os.chmod(tmp, 0o777 & ~_UMASK)
        if os.path.lexists(dst):
            os.replace(dst, old)
        os.replace(tmp, dst)
    except BaseException:
        if os.path.lexists(old) and not os.path.lexists(dst):
            os.replace(old, dst)  # stopped between the renames: the previous folder goes back
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        elif os.path.lexists(old):
            old.unlink()

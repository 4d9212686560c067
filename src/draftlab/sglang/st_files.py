"""Which safetensors files SGLang would read from a draft folder, and their headers without loading tensors.

check-draft must stay cheap on a 2 GB draft, so it reads only the JSON header at the front of each file
(8-byte little-endian length, then JSON). File selection follows SGLang's loader (its patterns and index name
read from its source, draft_config_contract.json): with an index file, only the files it lists; otherwise every
file of the first pattern that matches. More than one safetensors file without an index is refused: SGLang loads
them all, a key in two files taking the values of whichever comes last, so what it serves is arbitrary.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from draftlab.sglang.draft_config import weight_files

# safetensors dtype names -> torch dtype names, for messages and for checking d2t is an integer tensor.
INT_DTYPES = {"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64"}
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


class DraftFilesError(ValueError):
    """The folder has no checkpoint SGLang could read (or the header is corrupt)."""


class UnreadableFile(DraftFilesError):
    """A file that cannot be read or is not what it claims (truncated, corrupt): check-draft cannot check it."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)


INDEX_NAME = weight_files()["index"]


def checkpoint_files(folder: Path) -> list[Path]:
    folder = Path(folder)
    index = folder / INDEX_NAME
    if index.exists():
        try:
            listed = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
            raise UnreadableFile(index, f"not a readable index ({err})") from None
        files = [folder / name for name in listed]
        missing = [str(f.name) for f in files if not f.exists()]
        if missing:
            raise DraftFilesError(f"{index}: lists files that do not exist: {missing}")
        return files
    for pattern in weight_files()["patterns"]:  # SGLang takes the first pattern that matches
        files = sorted(folder.glob(pattern))
        if files:
            break
    if not files:
        raise DraftFilesError(f"{folder}: no weight file ({', '.join(weight_files()['patterns'])})")
    names = [p.name for p in files]
    if not pattern.endswith(".safetensors"):
        raise DraftFilesError(f"{folder}: SGLang would load {names}, which cannot be checked: convert them to "
                              "safetensors first")
    if len(files) > 1:
        raise DraftFilesError(f"{folder}: {len(files)} weight files {names} and no {INDEX_NAME}: SGLang loads every "
                              "one, a key in two files taking the values of the last, so the weights it serves are "
                              f"arbitrary; remove the stale file(s) or write an index")
    return files


def read_header(path: Path) -> dict[str, dict]:
    """key -> {"dtype": "F32", "shape": [..]} from one safetensors file, reading only its header; a file that
    cannot be read, or whose size is not what its header describes (a partial copy), raises UnreadableFile."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            raw = handle.read(8)
            if len(raw) != 8:
                raise UnreadableFile(path, f"{size} bytes: too short to be a safetensors file")
            (length,) = struct.unpack("<Q", raw)
            if length > 100 * 1024 * 1024:
                raise UnreadableFile(path, f"header length {length} is implausible: not a safetensors file?")
            if 8 + length > size:
                raise UnreadableFile(path, f"cut short: {size} bytes, but its header alone takes {8 + length} "
                                     "(a partial copy?)")
            header = json.loads(handle.read(length))
    except OSError as err:
        raise UnreadableFile(path, f"cannot be read ({err.strerror or err})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UnreadableFile(path, f"the header is not valid JSON ({err}): not a safetensors file?") from None
    if not isinstance(header, dict):
        raise UnreadableFile(path, "the header is not a JSON object: not a safetensors file?")
    header.pop("__metadata__", None)
    end = 0
    for key, info in header.items():
        try:
            begin, stop = (int(x) for x in info["data_offsets"])
            width = DTYPE_BYTES.get(info["dtype"])
            count = math.prod(int(d) for d in info["shape"])
        except (KeyError, TypeError, ValueError):
            raise UnreadableFile(path, f"header entry {key!r} lacks dtype, shape or data_offsets") from None
        if width is not None and stop - begin != count * width:
            raise UnreadableFile(path, f"{key}: data_offsets span {stop - begin} bytes, its {info['dtype']} "
                                 f"shape {list(info['shape'])} needs {count * width}")
        end = max(end, stop)
    expected = 8 + length + end
    if size < expected:
        raise UnreadableFile(path, f"cut short: {size} of the {expected} bytes its header describes "
                             "(a partial copy?)")
    if size > expected:
        raise UnreadableFile(path, f"{size - expected} bytes beyond the tensors its header describes")
    return header


def read_headers(folder: Path) -> dict[str, dict]:
    """key -> {"dtype", "shape", "file"} over every checkpoint file SGLang would read."""
    out: dict[str, dict] = {}
    for path in checkpoint_files(folder):
        for key, info in read_header(path).items():
            out[key] = {"dtype": info["dtype"], "shape": tuple(info["shape"]), "file": path.name}
    return out


def load_tensors(folder: Path, keys: list[str] | None = None) -> dict:
    """Loads the named tensors (all when keys is None) from the folder's checkpoint files."""
    from safetensors import safe_open

    wanted = None if keys is None else set(keys)
    out = {}
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                if wanted is None or key in wanted:
                    out[key] = handle.get_tensor(key)
    return out

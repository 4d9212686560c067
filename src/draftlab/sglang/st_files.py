"""Which safetensors files SGLang would read from a draft folder, and their headers without loading tensors.

check-draft must stay cheap on a 2 GB draft, so it reads only the JSON header at the front of each file
(8-byte little-endian length, then JSON). File selection follows SGLang's loader: with an index file, only
the files it lists; otherwise every `*.safetensors` in the folder.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

INDEX_NAME = "model.safetensors.index.json"

# safetensors dtype names -> torch dtype names, for messages and for checking d2t is an integer tensor.
INT_DTYPES = {"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64"}


class DraftFilesError(ValueError):
    """The folder has no checkpoint SGLang could read (or the header is corrupt)."""


def checkpoint_files(folder: Path) -> list[Path]:
    folder = Path(folder)
    index = folder / INDEX_NAME
    if index.exists():
        listed = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        files = [folder / name for name in listed]
        missing = [str(f.name) for f in files if not f.exists()]
        if missing:
            raise DraftFilesError(f"{index}: lists files that do not exist: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        bins = sorted(p.name for p in folder.glob("*.bin"))
        hint = f" (found {bins}: convert them to safetensors first)" if bins else ""
        raise DraftFilesError(f"{folder}: no *.safetensors checkpoint{hint}")
    return files


def read_header(path: Path) -> dict[str, dict]:
    """key -> {"dtype": "F32", "shape": [..]} from one safetensors file, reading only its header."""
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise DraftFilesError(f"{path}: too short to be a safetensors file")
        (length,) = struct.unpack("<Q", raw)
        if length > 100 * 1024 * 1024:
            raise DraftFilesError(f"{path}: header length {length} is implausible; corrupt file?")
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
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

"""The small file an exported draft folder carries about the features it was trained on.

`check-draft DIR` reads it so that, with no flags, it can check `fc`'s width and the layer ids against what
training actually used: a draft whose config.json was edited to other ids (or whose fc was cut to one layer)
is self-consistent, loads cleanly in SGLang and serves garbage, so only this record can catch it.
The record also seals the draft: the sha256 of config.json and of every weight file as exported, so that a
draft changed afterwards (a norm scaled, rope_theta edited) is told apart from the one that was trained.
Kept free of torch: check-draft reads it without loading a model.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftlab.util.fsutil import atomic_write_json
from draftlab.provenance.provenance import file_sha256, fingerprint

FILE = "draftlab_provenance.json"
FORMAT = "draftlab.draft_provenance/2"
UNSEALED_FORMAT = "draftlab.draft_provenance/1"  # the same record without content hashes; still read


def extract_fingerprint(manifest: dict) -> str:
    """What identifies an extract pool: its settings and inputs, not its (growing) shard list."""
    target = manifest.get("target") or {}
    return fingerprint({k: manifest.get(k) for k in ("format", "mode", "layer_ids", "convention", "dtype",
                                                      "samples_fingerprint")}
                       | {"target": target.get("fingerprint")})


def from_extract_manifest(manifest: dict) -> dict:
    """The record for a draft trained on the features `manifest` (an extract manifest, offline or online)."""
    target = manifest.get("target") or {}
    tc = target.get("config") or {}
    layer_ids = [int(i) for i in manifest.get("layer_ids", manifest.get("layers", []))]
    hidden = int(target.get("hidden_size") or tc.get("hidden_size"))
    return {
        "format": FORMAT,
        "extract_fingerprint": extract_fingerprint(manifest),
        "layer_ids": layer_ids,
        "feature_width": len(layer_ids) * hidden,
        "capture_points": manifest.get("capture_points"),
        "target": {"name": target.get("name"), "fingerprint": target.get("fingerprint"), "hidden_size": hidden,
                   "num_hidden_layers": target.get("num_layers") or tc.get("num_hidden_layers"),
                   "vocab_size": target.get("vocab_size") or tc.get("vocab_size"),
                   "model_type": tc.get("model_type"), "architectures": tc.get("architectures"),
                   "max_position_embeddings": tc.get("max_position_embeddings")},
    }


def read(folder: Path) -> dict | None:
    """The folder's record, or None when it has none; a malformed one raises ValueError naming the file."""
    path = Path(folder) / FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    missing = [k for k in ("layer_ids", "feature_width", "target") if k not in data]
    if data.get("format") not in (FORMAT, UNSEALED_FORMAT) or missing:
        raise ValueError(f"{path}: not a {FORMAT} record (format {data.get('format')!r}, missing {missing})")
    if data["format"] == FORMAT and not isinstance(data.get("files"), dict):
        raise ValueError(f"{path}: files: missing, the content hashes of the exported draft")
    return data


def sealed_files(folder: Path) -> list[str]:
    """The files whose content the record vouches for: config.json and every weight file SGLang reads."""
    from draftlab.sglang.st_files import INDEX_NAME, checkpoint_files

    folder = Path(folder)
    names = ["config.json"] + [p.name for p in checkpoint_files(folder)]
    return names + [INDEX_NAME] if (folder / INDEX_NAME).exists() else names


def file_hash(path: Path) -> str:
    return "sha256:" + file_sha256(path)


def write_sealed(folder: Path, record: dict) -> dict:
    """Writes `record` into `folder` with the hashes of the folder's files as they are now (export, convert)."""
    folder = Path(folder)
    sealed = {k: v for k, v in record.items() if k != "files"} | {
        "format": FORMAT, "files": {name: file_hash(folder / name) for name in sealed_files(folder)}}
    atomic_write_json(folder / FILE, sealed)
    return sealed


def changed_files(folder: Path, record: dict) -> dict[str, str]:
    """file name -> what differs from the record's hashes (empty when the draft is as exported)."""
    folder = Path(folder)
    recorded, present = record["files"], sealed_files(folder)
    changed = {}
    for name in sorted(set(recorded) | set(present)):
        if name not in present:
            changed[name] = "recorded at export, now missing"
        elif name not in recorded:
            changed[name] = "not in the record: added after export"
        elif file_hash(folder / name) != recorded[name]:
            changed[name] = "content changed after export (sha256 differs from the record)"
    return changed

"""The small file an exported draft folder carries about the features it was trained on.

`check-draft DIR` reads it so that, with no flags, it can check `fc`'s width and the layer ids against what
training actually used: a draft whose config.json was edited to other ids (or whose fc was cut to one layer)
is self-consistent, loads cleanly in SGLang and serves garbage, so only this record can catch it.
Kept free of torch: check-draft reads it without loading a model.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftlab.provenance import fingerprint

FILE = "draftlab_provenance.json"
FORMAT = "draftlab.draft_provenance/1"


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
    if data.get("format") != FORMAT or missing:
        raise ValueError(f"{path}: not a {FORMAT} record (format {data.get('format')!r}, missing {missing})")
    return data

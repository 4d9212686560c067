"""Reading the target's config.json (a local folder or a hub name) and an extract-stage manifest's layer ids."""

from __future__ import annotations

import json
from pathlib import Path


def load_target_config(target: str | Path | None) -> tuple[dict | None, str | None]:
    """(config, None) or (None, why it could not be read). A hub name is only read from the local HF cache."""
    if target is None:
        return None, "no --target given: vocabulary, width, layer-range and context checks skipped"
    path = Path(target).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.exists():
            return None, f"{path}: no config.json"
        try:
            return json.loads(config_path.read_text()), None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            return None, f"{config_path}: cannot be read as JSON ({err})"
    if path.suffix == ".json" and path.is_file():
        return json.loads(path.read_text()), None
    if path.is_absolute() or str(target).startswith((".", "~")) or len(path.parts) > 2 or path.suffix == ".json":
        # a path, not a hub name (org/name): say that it is missing, not that the cache lacks it
        return None, f"{target}: no such folder"
    try:  # a hub name: never reach the network from a check, use the cache only
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(str(target), "config.json")
    except Exception as err:  # noqa: BLE001 - any failure just means "not available"
        return None, f"{target}: cannot look up the hub cache ({err})"
    if isinstance(cached, str) and Path(cached).exists():
        return json.loads(Path(cached).read_text()), None
    return None, f"{target}: no such folder, and no model of that name in the local Hugging Face cache"


def manifest_layer_ids(manifest: str | Path | None) -> list[int] | None:
    """Layer ids (output of decoder layer k) an extract-stage manifest says were used; None when not given."""
    if manifest is None:
        return None
    path = Path(manifest)
    if path.is_dir():
        path = path / "manifest.json"
    data = json.loads(path.read_text())
    for key in ("layers", "layer_ids", "extract_layers") if isinstance(data, dict) else ():
        if isinstance(data[key] if key in data else None, list):
            return [int(i) for i in data[key]]
    raise ValueError(f"{path}: no 'layers' (or 'layer_ids') list in the extract manifest")

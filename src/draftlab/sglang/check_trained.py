"""check-draft's checks against how the draft was trained, and its weight scan.

A draft folder can be internally consistent and still wrong for serving: config.json edited to other layer ids,
or `fc` cut to one layer with a single id (SGLang 0.5.23 sizes fc from the number of ids, so it loads cleanly
and serves at accept length ~1). Only the draft's own record of its training features
(`draftlab_provenance.json`, written by export.py) can catch that. The weight scan catches what headers cannot:
NaN/Inf values and all-zero tensors (a diverged run, a lost tensor).
"""

from __future__ import annotations

from pathlib import Path

from draftlab import draft_provenance
from draftlab.sglang.st_files import checkpoint_files

IDS_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"


def load_provenance(report, folder: Path) -> dict | None:
    """The folder's provenance record; a missing one is a warning, a malformed one an error."""
    try:
        prov = draft_provenance.read(folder)
    except ValueError as err:
        report.error(draft_provenance.FILE, str(err))
        return None
    if prov is None:
        report.warn(draft_provenance.FILE, "absent: layer ids and fc width are not checked against the training "
                    "features (pass --extract-manifest to check the ids)")
    return prov


def target_from_provenance(prov: dict) -> dict:
    """The target facts the record keeps, in config.json's names, for the checks that need a target."""
    return {k: v for k, v in prov["target"].items() if v is not None and k not in ("name", "fingerprint")}


def check_target_agrees(report, prov: dict, target: dict) -> None:
    """--target given as well: it must be the model the features came from (shape-wise)."""
    for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
        trained = prov["target"].get(key)
        if trained is not None and target.get(key) is not None and trained != target.get(key):
            report.error("--target", f"{key} {target.get(key)} != {trained} of the target the draft was trained on "
                         f"({draft_provenance.FILE})")


def check_layer_ids(report, config: dict, prov: dict) -> None:
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    trained = list(prov["layer_ids"])
    if ids is None:
        report.error(IDS_KEY, f"absent, so SGLang captures its default layers; the draft was trained on {trained} "
                     f"({draft_provenance.FILE})")
    elif list(ids) != trained:
        report.error(IDS_KEY, f"{list(ids)} != {trained}, the layer ids of the features the draft was trained on "
                     f"({draft_provenance.FILE}): SGLang would feed it other layers than it learned on")


def check_fc_width(report, headers: dict, prov: dict) -> None:
    """fc's input width must be the training features' width (layers x target hidden)."""
    width = int(prov["feature_width"])
    for key in ("fc.weight", "model.fc.weight"):
        shape = headers.get(key, {}).get("shape")
        if shape is not None and len(shape) == 2 and shape[1] != width:
            hidden = prov["target"].get("hidden_size") or 1
            report.error(key, f"input width {shape[1]} ({shape[1] / hidden:g} layer(s)) != {width}, the width of "
                         f"the {len(prov['layer_ids'])}-layer features it was trained on ({draft_provenance.FILE}); "
                         "SGLang sizes fc from the number of ids, so it would load and serve at accept ~1")


def scan_weights(report, folder: Path) -> None:
    """NaN/Inf values and all-zero floating tensors, one tensor at a time (memory stays at one tensor)."""
    import torch
    from safetensors import safe_open

    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                tensor = handle.get_tensor(key)
                if not tensor.is_floating_point() or tensor.numel() == 0:
                    continue  # d2t / t2d are integer and bool maps
                bad = int((~torch.isfinite(tensor)).sum())
                if bad:
                    report.error(key, f"{bad} of {tensor.numel()} values are NaN or Inf ({path.name})")
                elif not bool(tensor.any()):
                    report.error(key, f"all {tensor.numel()} values are zero ({path.name}): an untrained or lost "
                                 "tensor")

"""check-draft's checks against how the draft was trained, and its weight scan.

A draft folder can be internally consistent and still wrong for serving: config.json edited to other layer ids,
or `fc` cut to one layer with a single id (SGLang 0.5.23 sizes fc from the number of ids, so it loads cleanly
and serves at accept length ~1). Only the draft's own record of its training features
(`draftlab_provenance.json`, written by export.py) can catch that; its content hashes tell a draft changed after
export from the trained one. The weight scan catches what headers cannot: NaN/Inf values, all-zero tensors (a
diverged run, a lost tensor), norm gains far outside what training leaves and head rows that win every logit.
"""

from __future__ import annotations

from pathlib import Path

from draftlab.sglang import draft_provenance
from draftlab.sglang.st_files import DraftFilesError, checkpoint_files

IDS_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"
HEAD_KEYS = ("lm_head.weight", "model.lm_head.weight")
# RMSNorm gains start at 1 and training moves them by a few units; a gain this large scales features out of range.
NORM_LIMIT = 100.0
# A head row this many times the median row's norm outweighs the others for nearly any hidden state.
HEAD_RATIO = 20.0
UNSEALED_CHECKS = ("proof that the weights and config.json are the ones training produced (a changed value that "
                   "stays in range goes unseen), and the layer-id, fc-width and target checks compare with the "
                   "draft as trained, not as changed")


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


def check_seal(report, folder: Path, prov: dict, allow_modified: bool) -> bool:
    """The files are those the record's hashes vouch for: a file changed, added or removed after export is an
    error naming it (a warning with `allow_modified`); False when one did."""
    if "files" not in prov:
        report.warn(draft_provenance.FILE, "holds no content hashes (written before exports were sealed): a change "
                    "to the weights or config.json after export cannot be seen; export or convert it again to seal it")
        return True
    try:
        changed = draft_provenance.changed_files(folder, prov)
    except DraftFilesError:
        return True  # no checkpoint to compare: the header check names what is missing
    for name, what in changed.items():
        if allow_modified:
            report.warn(name, f"{what} (--allow-modified)")
        else:
            report.error(name, f"{what}: this is not the draft that was trained (the findings below show what the "
                         "change does); pass --allow-modified to accept a draft changed on purpose")
    if changed and allow_modified:
        report.warn(draft_provenance.FILE, f"a modified draft cannot get: {UNSEALED_CHECKS}")
    return not changed


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
    """NaN/Inf values, all-zero floating tensors, norm gains out of range and dominant head rows, one tensor at a
    time (memory stays at one tensor)."""
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
                elif key.endswith("norm.weight"):
                    _check_norm(report, key, tensor.float())
                elif key in HEAD_KEYS and tensor.dim() == 2:
                    _check_head(report, key, tensor.float())


def _check_norm(report, key: str, gains) -> None:
    peak = float(gains.abs().max())
    if peak > NORM_LIMIT:
        report.error(key, f"norm gains reach {peak:g}, far outside the range training leaves them in (they start "
                     "at 1): the features this norm scales are out of range")


def _check_head(report, key: str, head) -> None:
    norms = head.norm(dim=1)
    median = float(norms.median())
    if median <= 0:
        return
    loud = (norms > HEAD_RATIO * median).nonzero().flatten().tolist()
    if loud:
        report.error(key, f"draft id(s) {loud[:8]} have rows up to {float(norms.max()) / median:.0f}x the median "
                     "row norm: they win nearly every logit, so the draft proposes them whatever it reads")

"""The resumable checkpoint's files: one folder per checkpoint under `checkpoints/`, `latest.json` naming the newest.

A checkpoint folder holds `model.safetensors` (trainable weights), `optimizer.safetensors` (AdamW state, keyed
`<param index>.<name>`), `rng.safetensors` (torch and CUDA generator states) and `trainer.json` (the loop's
state, the optimizer's param groups, Python's RNG state). It is written into `.<name>.tmp` and renamed, and
`latest.json` moves only after the rename, so a kill at any point leaves the previous checkpoint usable. A second
write at the same position (the loop saves again after its last window and validation) takes a new folder,
`<name>-001`, rather than replacing the one `latest.json` may name: a kill between removing that one and the rename
left `latest.json` naming nothing (found by tests/integration/test_crash_resume.py, pinned by
tests/unit/test_checkpoint.py). Nothing is ever unpickled. What the state means is the loop's business (train/loop.py).
"""

from __future__ import annotations

import copy
import itertools
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from draftlab.util import fsutil

CKPT_FORMAT = "draftlab.train-checkpoint/1"
KEEP_CHECKPOINTS = 2


def frozen_names(model: torch.nn.Module) -> set[str]:
    """The parameters training leaves as they are (the target's embedding; the head under train.freeze_lm_head)."""
    return {n for n, p in model.named_parameters() if not p.requires_grad}


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Everything in the state dict except frozen parameters (the target embedding is re-copied on load), where the
    tensors live: the live ones, which whoever keeps them copies to the host (`snapshot_checkpoint`, the loop's
    best weights)."""
    frozen = frozen_names(model)  # once, not per key
    return {k: v.detach() for k, v in model.state_dict().items() if k not in frozen}


def load_trainable(model: torch.nn.Module, path: Path) -> None:
    missing, unexpected = model.load_state_dict(load_file(str(path)), strict=False)
    frozen = frozen_names(model)
    if unexpected or set(missing) - frozen:
        raise ValueError(f"{path}: missing {sorted(set(missing) - frozen)}, unexpected {sorted(unexpected)}")


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest complete checkpoint folder in `ckpt_dir`, or None."""
    latest = fsutil.read_json(Path(ckpt_dir) / "latest.json")
    return Path(ckpt_dir) / latest["name"] if latest else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, a checkpoints/ folder or a train-stage folder -> the checkpoint folder."""
    path = Path(path)
    for candidate in (path, path / "checkpoints"):
        if (candidate / "trainer.json").exists():
            return candidate
        latest = latest_checkpoint(candidate)
        if latest:
            return latest
    raise FileNotFoundError(f"train.init_from: no checkpoint at {path}")


def _unused(ckpt_dir: Path, name: str) -> str:
    """`name`, or `name-001`, `name-002`... when taken: zero-padded, so the names still sort by age."""
    candidates = itertools.chain([name], (f"{name}-{n:03d}" for n in itertools.count(1)))
    return next(c for c in candidates if not (Path(ckpt_dir) / c).exists())


def host_copies(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Host copies owned by the caller: a CPU tensor is copied too, since the next step changes it in place."""
    return {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}


def snapshot_checkpoint(model: dict[str, torch.Tensor], optimizer: dict, state: dict) -> dict:
    """What a checkpoint holds (weights, `optimizer.state_dict()`, RNG states and `state`), taken now and owned by
    nobody else: `host_copies` of the tensors and a deep copy of the loop's state. `write_snapshot` can then write
    it on another thread while training goes on."""
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng.update({f"cuda.{i}": t for i, t in enumerate(torch.cuda.get_rng_state_all())})
    return {"model": host_copies(model),
            "optimizer": host_copies({f"{i}.{k}": v for i, st in optimizer["state"].items() for k, v in st.items()}),
            "rng": rng,
            "trainer": copy.deepcopy(dict(state, format=CKPT_FORMAT, param_groups=optimizer["param_groups"],
                                          python_rng=list(random.getstate())))}


def write_snapshot(ckpt_dir: Path, name: str, snapshot: dict) -> None:
    """Writes a `snapshot_checkpoint` as checkpoint `name` (or `name-001`... when taken), points `latest.json` at it,
    and keeps the newest KEEP_CHECKPOINTS."""
    name = _unused(ckpt_dir, name)
    final = ckpt_dir / name
    tmp = ckpt_dir / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fsutil.atomic_save_safetensors(tmp / "model.safetensors", snapshot["model"])
    fsutil.atomic_save_safetensors(tmp / "optimizer.safetensors", snapshot["optimizer"])
    fsutil.atomic_save_safetensors(tmp / "rng.safetensors", snapshot["rng"])
    fsutil.atomic_write_json(tmp / "trainer.json", snapshot["trainer"])
    os.replace(tmp, final)
    fsutil.atomic_write_json(ckpt_dir / "latest.json", {"name": name, "step": snapshot["trainer"]["step"]})
    older = sorted(p for p in ckpt_dir.glob("ckpt-*") if p.name != name)
    for old in older[: max(0, len(older) - (KEEP_CHECKPOINTS - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def prune_best_files(ckpt_dir: Path, keep: str | None) -> None:
    """Removes the best-weights files of earlier best passes: only `keep` (the best so far) stays."""
    for path in Path(ckpt_dir).glob("best-epoch*.safetensors"):
        if path.name != keep:
            path.unlink()


def read_checkpoint(folder: Path) -> tuple[dict, dict]:
    """(the loop's state, the optimizer state dict) of a checkpoint; restores the RNG states it saved."""
    folder = Path(folder)
    state = fsutil.read_json(folder / "trainer.json")
    if not state or state.get("format") != CKPT_FORMAT:
        raise ValueError(f"{folder}: not a {CKPT_FORMAT} checkpoint")
    opt_state: dict[int, dict] = {}
    for key, value in load_file(str(folder / "optimizer.safetensors")).items():
        index, name = key.split(".", 1)
        opt_state.setdefault(int(index), {})[name] = value
    optimizer = {"state": opt_state, "param_groups": state.pop("param_groups")}
    rng = load_file(str(folder / "rng.safetensors"))
    torch.set_rng_state(rng["torch"])
    cuda = [rng[k] for k in sorted(k for k in rng if k.startswith("cuda."))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    py = state.pop("python_rng")
    random.setstate((py[0], tuple(py[1]), py[2]))
    for key in ("format", "settings"):
        state.pop(key, None)
    return state, optimizer

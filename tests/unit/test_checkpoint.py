"""The checkpoint folder's writes: `latest.json` names a complete checkpoint whatever point a save stops at."""

from __future__ import annotations

import os

import pytest
import torch

from draftlab.train import checkpoint
from draftlab.train.checkpoint import (KEEP_CHECKPOINTS, latest_checkpoint, read_checkpoint, snapshot_checkpoint,
                                       write_snapshot)

NAME = "ckpt-000000003-e0001-b000000000"


def optimizer_state() -> dict:
    weight = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([weight])
    weight.sum().backward()
    opt.step()
    return opt.state_dict()


def save(folder, name: str, marker: int) -> None:
    write_snapshot(folder, name, snapshot_checkpoint({"w": torch.full((4,), float(marker))}, optimizer_state(),
                                                     {"step": 3, "marker": marker}))


def test_a_save_stopped_before_its_rename_leaves_latest_readable(tmp_path, monkeypatch):
    """The loop saves twice at one position (after its last window and validation). A second save that removed the
    first's folder before renaming its own into place, stopped between the two, would leave `latest.json` naming
    nothing."""
    save(tmp_path, NAME, 1)
    real = os.replace

    def stop_at_the_folder_rename(src, dst):
        if os.path.isdir(src):
            raise KeyboardInterrupt("stopped before the rename")  # what a kill leaves, minus the process
        return real(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", stop_at_the_folder_rename)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, NAME, 2)
    monkeypatch.setattr(checkpoint.os, "replace", real)

    state, _ = read_checkpoint(latest_checkpoint(tmp_path))
    assert state["marker"] == 1


def test_a_second_save_at_one_position_takes_a_new_folder_that_sorts_after(tmp_path):
    for marker in (1, 2, 3):
        save(tmp_path, NAME, marker)
    latest = latest_checkpoint(tmp_path)
    assert latest.name == f"{NAME}-002"
    assert read_checkpoint(latest)[0]["marker"] == 3
    kept = sorted(p.name for p in tmp_path.glob("ckpt-*"))
    assert kept == [f"{NAME}-001", f"{NAME}-002"] and len(kept) == KEEP_CHECKPOINTS
    save(tmp_path, "ckpt-000000004-e0001-b000000001", 4)  # a later position sorts after every rewrite
    assert sorted(p.name for p in tmp_path.glob("ckpt-*"))[-1] == "ckpt-000000004-e0001-b000000001"

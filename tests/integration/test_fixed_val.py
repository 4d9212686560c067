"""data.val_samples: one validation set for every data.samples of a sweep, made before the training pool."""

from __future__ import annotations

import json
from pathlib import Path

from draftlab.data.prompts import Prompt, pool_order, split_for
from draftlab.data.reader import open_source
from draftlab.data.samples import read_samples
from draftlab.plan.stage_keys import STAGES, StageSpec, plan
from draftlab.task import run_task


def test_pool_order_puts_the_first_held_out_prompts_first():
    prompts = [Prompt(f"p{i}", f"c{i}") for i in range(200)]
    val = [p for p in prompts if split_for(p.conversation_id, 0.25) == "val"]
    ordered = pool_order(prompts, 0.25, 5)
    assert ordered[:len(val)] == val and 5 < len(val) < 100
    assert all(split_for(p.conversation_id, 0.25) == "train" for p in ordered[len(val):])
    assert len(ordered) == 200 and pool_order(prompts, 0.25, 0) is prompts


def _val_indices(cfg, folders) -> list[int]:
    source = open_source(cfg, folders)
    return sorted(e.sample_index for e in source.entries if e.split == "val")


def test_every_size_is_scored_on_the_same_validation_samples(tiny_cfg):
    seen, scored = {}, {}
    for samples in (8, 16):
        cfg = tiny_cfg("stages=[generate,extract,train]", f"data.samples={samples}", "data.val_samples=4",
                       "tracking.enabled=false")
        metrics = run_task(cfg)
        planned = plan(cfg)
        folders = {name: planned[name].folder for name in ("generate", "extract")}
        seen[samples] = _val_indices(cfg, folders)
        source = open_source(cfg, folders)
        assert source.num_samples_in("train") == samples  # data.samples counts the training pool alone
        # the train stage scores each validation sample and keeps the results beside the draft
        scored[samples] = json.loads((planned["train"].folder / "val_samples.json").read_text())
        assert metrics["val/samples"] == len(scored[samples]["index"])
    assert seen[8] == seen[16] == [0, 1, 2, 3]
    assert scored[8]["index"] == scored[16]["index"] == [0.0, 1.0, 2.0, 3.0]
    assert scored[8]["loss"] != scored[16]["loss"]  # two drafts, one validation set
    pool = list(read_samples(Path(planned["generate"].folder), limit=20))
    assert [s.split for s in pool[:4]] == ["val"] * 4 and {s.split for s in pool[4:]} == {"train"}


def test_nested_splits_grow_with_the_data_without_it(tiny_cfg):
    """The older behaviour, data.val_samples=0: each size's validation set is the held-out share of its own."""
    cfg = tiny_cfg("data.samples=16", "data.val_samples=0", "data.val_fraction=0.5")
    assert plan(cfg)["generate"].folder_key != plan(tiny_cfg("data.samples=16", "data.val_samples=4",
                                                             "data.val_fraction=0.5"))["generate"].folder_key


def test_the_setting_at_zero_keeps_every_existing_folder(tiny_cfg, monkeypatch):
    """Folder keys at data.val_samples=0 are what they were before the setting existed."""
    cfg = tiny_cfg("data.samples=16")
    with_it = {name: stage.key for name, stage in plan(cfg).items()}
    for name, spec in STAGES.items():
        others = tuple(k for k in spec.when_set if k != "data.val_samples")  # the keys of other settings stay
        monkeypatch.setitem(STAGES, name, StageSpec(spec.name, spec.reads, spec.needs, spec.grows_with, others))
    assert {name: stage.key for name, stage in plan(cfg).items()} == with_it

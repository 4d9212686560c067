"""Shared fixtures: configs composed from conf/ the way src/run.py composes them, shrunk for the tiny target."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


def compose_config(overrides: list[str] | None = None):
    """The composed (not yet validated) config, as Hydra gives it to src/run.py."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides or []))


def tiny_overrides(tmp_path: Path, *extra: str) -> list[str]:
    """A whole pipeline on the tiny random target in seconds, tracked into a store under tmp_path."""
    return [
        "target=tiny",
        f"paths.root={tmp_path / 'out'}",
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
        "data.samples=32",
        "data.max_new_tokens=12",
        "data.batch_size=8",
        "data.shard_size=16",
        "data.max_prompt_tokens=384",
        "data.val_fraction=0.25",
        "extract.dtype=float32",
        "draft.vocab_size=64",
        "train.epochs=1",
        "train.batch_tokens=2048",
        "bench.prompts=2",
        "bench.max_new_tokens=8",
        *extra,
    ]


@pytest.fixture
def tiny_cfg(tmp_path):
    """A factory: tiny_cfg('data.samples=8', ...) -> composed config for the tiny target under tmp_path."""

    def make(*extra: str):
        return compose_config(tiny_overrides(tmp_path, *extra))

    return make


# The tiny target's kernels take microseconds: a second OpenMP thread only adds contention on a 2-core machine
# (measured 10x slower test runs). Tests that load SmolLM2 raise it again for their own work.
import torch  # noqa: E402

torch.set_num_threads(1)

"""Shared fixtures: configs composed from conf/ the way src/run.py composes them; the tiny recipe is
experiment=smoke."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
BENCHMARKS = REPO / "benchmarks"


def benchmark_script(name: str):
    """benchmarks/NAME.py as a module (benchmarks/ is scripts, not a package): its functions tested where they are."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compose_config(overrides: list[str] | None = None):
    """The composed (not yet validated) config, as Hydra gives it to src/run.py."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides or []))


def tiny_overrides(tmp_path: Path, *extra: str) -> list[str]:
    """The one tiny recipe, `experiment=smoke` (conf/experiment/smoke.yaml), with its outputs and its tracking
    under tmp_path. The experiment stays `draftlab`, as tests read runs back from it."""
    return [
        "experiment=smoke",
        f"paths.root={tmp_path / 'out'}",
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
        "tracking.experiment=draftlab",
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


GENERATE_STANDIN = Path(__file__).with_name("standin_generate_server.py")


@pytest.fixture
def standin():
    """Starts tests/standin_generate_server.py with the given flags and returns its URL; stopped after the test."""
    procs = []

    def start(*flags: str) -> str:
        proc = subprocess.Popen([sys.executable, str(GENERATE_STANDIN), *flags], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        return f"http://127.0.0.1:{int(line.split()[1])}"

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()

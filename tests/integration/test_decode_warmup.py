"""The decode step's compile built ahead (draftlab/warmup/decode.py): when a job starts it, and that the generate
stage then loads the graph from torch.compile's cache instead of compiling it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from conftest import REPO, compose_config, tiny_overrides
from draftlab.target import target as target_module
from draftlab.config.config import validate
from draftlab.pipeline import plan
from draftlab.warmup.launch import Warmup, wanted

GRAPHS = ("data.generator=graphs", "data.compile_decode=true")


def test_the_decode_warm_up_starts_when_generate_compiles_its_step_on_a_gpu(tiny_cfg, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    on_gpu = lambda spec: torch.device("cuda")  # noqa: E731 (what the job's target.device resolves to)

    def graphs(cfg, stages=("generate", "extract", "train")):
        return wanted(cfg, plan(cfg), list(stages))

    cfg = validate(tiny_cfg(*GRAPHS))
    assert "decode" not in graphs(cfg)  # the tiny target is on the CPU: the compile would take generate's cores
    monkeypatch.setattr(target_module, "resolve_device", on_gpu)
    assert "decode" in graphs(cfg) and "decode" in graphs(cfg, ["generate"])  # no train stage needed
    assert "decode" not in graphs(cfg, ["extract", "train"])
    for off in (["data.compile_decode=false"], ["data.generator=plain"], ["data.temperature=0.7"],
                ["data.engine=server", "data.server.url=http://127.0.0.1:30000"], ["train.compile_warmup=false"]):
        assert "decode" not in graphs(validate(tiny_cfg(*GRAPHS, *off))), off
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert graphs(cfg) == []
    monkeypatch.delenv("WORLD_SIZE")
    done = plan(cfg)["generate"].done_record  # the pool is complete: nothing will be answered
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text("{}")
    assert "decode" not in graphs(cfg)


@pytest.mark.slow  # inductor compiles the tiny layer on the CPU three times (~30 s each cold on 2 cores)
def test_the_generate_stage_loads_the_step_the_warm_up_compiled(tmp_path):
    settings = [*GRAPHS, "data.samples=8", "data.shard_size=8", "data.batch_size=4", "train.compile_warmup=false",
                "tracking.enabled=false", "stages=[generate]"]

    def generate(name: str, cache: str) -> dict:
        """The generate stage alone, in a process of its own with the given compile cache."""
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / cache))
        job = tmp_path / name
        job.mkdir()  # paths.root's parent: draftlab makes paths.root only where its parent exists
        proc = subprocess.run([sys.executable, str(REPO / "src" / "run.py"), *tiny_overrides(tmp_path / name),
                               *settings, f"hydra.run.dir={job}"], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        if "torch.compile of the decode step failed" in proc.stdout + proc.stderr:
            pytest.skip("inductor cannot build here (no C++ compiler)")
        return json.loads((job / "results.json").read_text())["metrics"]

    assert generate("cold", "cache-a")["generate/decode_compile_cached"] == 0.0  # a fresh cache: compiled
    # the warm-up, into another fresh cache, on the job's resolved config, as draftlab/warmup/launch.py starts it
    cfg = validate(compose_config([*tiny_overrides(tmp_path / "warm"), *settings]))
    OmegaConf.save(cfg, tmp_path / "config.yaml", resolve=True)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache-b"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "draftlab", "warm-decode", str(tmp_path / "config.yaml"),
                           str(tmp_path / "decode.json")], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "decode.json").read_text())["decode_compile_s"] > 0
    metrics = generate("warm", "cache-b")
    assert metrics["generate/decode_compile_cached"] == 1.0  # the stage's compile came from the warm-up's cache
    assert metrics["generate/samples"] == 8


def test_a_decode_warm_up_still_running_when_generate_ends_is_stopped(tiny_cfg, caplog):
    warmup = Warmup.start(validate(tiny_cfg(*GRAPHS)), ["decode"])
    process = warmup.processes["decode"]
    with caplog.at_level(logging.INFO, logger="draftlab"):
        warmup.generate_done()  # importing torch alone takes it seconds
    assert "compile warm-up was still running when generate ended: stopped" in caplog.text
    assert process.returncode is not None and "decode" not in warmup.processes
    assert warmup.finish() == {} and not warmup.folder.exists()  # no unroll graphs: nothing to wait for or report

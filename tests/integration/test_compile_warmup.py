"""train.compile_warmup: the compiled unroll's graphs built in background processes while generate and extract run, and
loaded from torch.compile's cache by the train stage (draftlab/warmup/launch.py, warmup/compile.py)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile

import pytest

from conftest import REPO, tiny_overrides
from draftlab.config.config import validate
from draftlab.pipeline import plan
from draftlab.warmup.compile import warm_batch
from draftlab.train.device_batch import attach_plan
from draftlab.warmup import launch as warmup_module
from draftlab.util.reporting import RecordingReporter
from draftlab.warmup.launch import Warmup, wanted

STAGES = ["generate", "extract", "train"]


def _finished(planned, *names) -> None:
    for name in names:
        planned[name].done_record.parent.mkdir(parents=True, exist_ok=True)
        planned[name].done_record.write_text("{}")


def test_the_warm_up_starts_when_the_unroll_is_compiled_and_has_stages_to_overlap(tiny_cfg, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = validate(tiny_cfg("train.compile_unroll=true"))
    planned = plan(cfg)
    assert wanted(cfg, planned, STAGES)
    assert not wanted(cfg, planned, ["generate", "extract"])  # no train in this job
    assert not wanted(validate(tiny_cfg("train.compile_unroll=true", "train.compile_warmup=false")), planned, STAGES)
    assert not wanted(validate(tiny_cfg("train.device=cpu")), planned, STAGES)  # auto: compiled on CUDA only
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun's data-parallel trainer runs the eager unroll
    assert not wanted(cfg, planned, STAGES)
    monkeypatch.delenv("WORLD_SIZE")
    _finished(planned, "generate", "extract")  # nothing to overlap: auto waits for no one, true still starts it
    assert not wanted(cfg, planned, STAGES)
    assert wanted(validate(tiny_cfg("train.compile_unroll=true", "train.compile_warmup=true")), planned, STAGES)
    _finished(planned, "train")
    assert not wanted(validate(tiny_cfg("train.compile_unroll=true", "train.compile_warmup=true")), planned, STAGES)


@pytest.mark.parametrize("overrides", [[], ["hardware=gpu"]])
def test_the_warm_batch_passes_the_guards_a_real_batch_passes(tiny_cfg, overrides):
    cfg = validate(tiny_cfg(*overrides))
    batch = warm_batch(cfg, hidden=64, vocab=320, layers=3)
    B, T = batch["input_ids"].shape
    steps = int(cfg.train.ttt_steps)
    packed = attach_plan(batch, steps, 8)["packed_plan"]
    # two rows or more and every step with two pairs or more (0 and 1 specialise)
    assert B >= 2 and min(packed.sizes) >= 2 and len(packed.sizes) == steps
    assert batch["features"].dtype == getattr(__import__("torch"), cfg.extract.dtype)
    # the prompt share is outside the loss, padding is zero
    lengths = batch["attention_mask"].sum(1)
    assert (batch["loss_mask"].sum(1) < lengths).all()
    assert float(batch["features"][~batch["attention_mask"]].abs().sum()) == 0


def test_a_failed_warm_up_is_a_warning_with_its_log(tiny_cfg, caplog):
    cfg = validate(tiny_cfg("train.compile_unroll=false", "train.compile_warmup=true"))  # nothing to warm: it fails
    warmup = Warmup.start(cfg)
    with caplog.at_level(logging.INFO, logger="draftlab"):
        assert warmup.finish() == {"train/compile_warmup_ok": 0.0}
    for graph in ("training", "validation"):
        assert f"compile warm-up of the {graph} graph failed (exit 1)" in caplog.text
    assert "the unroll is not compiled" in caplog.text and not warmup.folder.exists()


def test_a_warm_up_still_running_when_the_job_ends_is_stopped(tiny_cfg):
    warmup = Warmup.start(validate(tiny_cfg("train.compile_unroll=true")))
    assert all(p.poll() is None for p in warmup.processes.values())  # importing torch takes them seconds
    warmup.stop()
    assert all(p.returncode is not None for p in warmup.processes.values()) and not warmup.folder.exists()


def test_a_warm_up_that_cannot_start_is_a_warning_and_leaves_nothing(tiny_cfg, caplog, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where its folder goes
    (tmp_path / "tmp").mkdir()
    started, popen = [], subprocess.Popen

    def popen_once(*args, **kwargs):  # the second process cannot start (say, no memory to fork)
        if started:
            raise OSError("Cannot allocate memory")
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(warmup_module.subprocess, "Popen", popen_once)
    with caplog.at_level(logging.WARNING, logger="draftlab"):
        assert Warmup.start(validate(tiny_cfg("train.compile_unroll=true"))) is None
    assert "could not start (Cannot allocate memory)" in caplog.text
    assert started[0].returncode is not None and not any((tmp_path / "tmp").iterdir())  # stopped, folder removed


def test_a_warm_up_past_its_time_is_stopped_and_train_compiles(tiny_cfg, caplog, monkeypatch):
    monkeypatch.setattr(warmup_module, "WAIT_MAX_S", 1.0)
    warmup = Warmup.start(validate(tiny_cfg("train.compile_unroll=true")))
    with caplog.at_level(logging.INFO, logger="draftlab"):
        assert warmup.finish() == {"train/compile_warmup_ok": 0.0}
    assert "past 1 s: stopped" in caplog.text and all(p.returncode is not None for p in warmup.processes.values())


def _recording_warmup(monkeypatch) -> list[str]:
    """The pipeline's Warmup replaced by one that lists the calls the pipeline makes."""
    from draftlab import pipeline

    calls = []

    class Recording:
        @classmethod
        def start(cls, cfg, graphs):
            calls.append("start")
            return cls()

        def generate_done(self):
            calls.append("generate_done")

        def finish(self):
            calls.append("finish")
            return {}

        def stop(self):
            calls.append("stop")

    monkeypatch.setattr(pipeline, "Warmup", Recording)
    monkeypatch.setattr(pipeline, "warmup_wanted", lambda *args: ["training", "validation", "decode"])
    return calls


def test_a_stage_failing_before_train_stops_the_warm_up(tiny_cfg, monkeypatch):
    from draftlab import pipeline
    from draftlab.stages import generate

    calls = _recording_warmup(monkeypatch)

    def broken(*args, **kwargs):
        raise RuntimeError("stage exploded")

    monkeypatch.setattr(generate, "run", broken)
    with pytest.raises(RuntimeError, match="stage exploded"):
        pipeline.run_stages(validate(tiny_cfg()), RecordingReporter())
    assert calls == ["start", "stop"]


@pytest.mark.parametrize("stages, expected", [(["generate", "extract", "train"], ["start", "generate_done", "finish"]),
                                              (["generate"], ["start", "generate_done", "stop"])])
def test_the_decode_warm_up_ends_with_generate_and_the_unroll_s_before_train(tiny_cfg, monkeypatch, stages, expected):
    from draftlab import pipeline

    calls = _recording_warmup(monkeypatch)
    monkeypatch.setattr(pipeline, "run_stage", lambda *args: ({}, {"produced_by": "commit"}))  # each stage done at once
    pipeline.run_stages(validate(tiny_cfg()), RecordingReporter(), stages)
    assert calls == expected


@pytest.mark.slow
def test_the_train_stage_loads_the_graph_the_warm_up_built(tmp_path):
    # a cache of its own: a graph left by another test or run must not count; two unrolled steps keep the CPU
    # compile near a minute (seven take about four)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    job = tmp_path / "job"
    proc = subprocess.run([sys.executable, str(REPO / "src" / "run.py"), *tiny_overrides(tmp_path),
                           "tracking.enabled=false", f"hydra.run.dir={job}", "train.compile_unroll=true",
                           "train.ttt_steps=2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "torch.compile of the unroll failed" in proc.stdout + proc.stderr:
        pytest.skip("inductor cannot build here (no C++ compiler)")
    metrics = json.loads((job / "results.json").read_text())["metrics"]
    # the warm-up compiled into an empty cache; both of the train stage's graphs (training, validation) came from it
    assert metrics["train/compile_warmup_ok"] == 1.0 and metrics["train/compile_warmup_s"] > 0
    assert metrics["train/compile_graphs"] == 2.0 and metrics["train/compile_cache_hits"] == 2.0
    # what the two loads spent, by phase (train/compiled_unroll.PHASES): Dynamo traced, the backend loaded modules
    assert metrics["train/compile_trace_s"] > 0 and 0 < metrics["train/compile_modules_s"]
    assert metrics["train/compile_modules_s"] <= metrics["train/compile_backend_s"] <= metrics["train/compile_s"]

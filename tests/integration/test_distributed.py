"""torchrun training on the CPU (gloo, 2 processes): the loss curve equals the one-process curve at the same
global batch; rank 0 alone writes and tracks; a job killed with kill -9 resumes under 2 processes."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import REPO, compose_config, tiny_overrides
from draftlab.config.config import validate
from draftlab.pipeline import plan, run_stages
from draftlab.util.reporting import RecordingReporter
from draftlab.train.distributed import local_rows

pytestmark = pytest.mark.slow
TRAIN = ("train.epochs=2", "train.log_every=1", "train.checkpoint_every=2", "train.batch_tokens=1536",
         "data.samples=32", "data.max_new_tokens=24")


def torchrun(tmp_path, *extra, wait=True):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(REPO / "src" / "run.py"), *tiny_overrides(tmp_path, *TRAIN, *extra), "stages=[generate,extract,train]",
            f"hydra.run.dir={tmp_path / 'run'}"]
    if not wait:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def one_process_curve(tmp_path, *extra):
    """The same job in this process, into its own folder tree: train/loss per step, and the final metrics."""
    cfg = validate(compose_config(tiny_overrides(tmp_path / "single", *TRAIN, *extra,
                                                 "stages=[generate,extract,train]")))
    reporter = RecordingReporter()
    metrics = run_stages(cfg, reporter)
    curve = {step: m["train/loss"] for step, m in reporter.history if "train/loss" in m}
    return curve, metrics


def mlflow_runs(tmp_path):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("draftlab")
    return client, client.search_runs([experiment.experiment_id])


def test_rows_of_a_batch_are_dealt_to_ranks_and_an_empty_rank_counts_nothing():
    batch = {"input_ids": torch.arange(12).view(3, 4), "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0],
                                                                                        [1, 1, 1, 0]]).bool(),
             "loss_mask": torch.ones(3, 4, dtype=torch.bool), "sample_index": torch.tensor([7, 8, 9])}
    first, second = local_rows(batch, 0, 2), local_rows(batch, 1, 2)
    assert first["sample_index"].tolist() == [7, 9] and first["input_ids"].shape == (2, 4)
    assert second["sample_index"].tolist() == [8] and second["input_ids"].shape == (1, 2)  # trimmed to its row
    lone = {k: v[:1] for k, v in batch.items()}
    idle = local_rows(lone, 1, 2)
    assert idle["input_ids"].shape == (1, 4) and not idle["loss_mask"].any()


def test_ddp_loss_curve_equals_one_process_and_only_rank0_tracks(tmp_path):
    curve, single = one_process_curve(tmp_path)
    assert len(curve) >= 4  # enough optimizer steps to compare a curve, not a point
    torchrun(tmp_path)
    client, runs = mlflow_runs(tmp_path)
    assert len(runs) == 1  # rank 1 never opened a run
    run = runs[0]
    assert run.info.status == "FINISHED"
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")}
    assert sorted(history) == sorted(curve)
    for step, loss in curve.items():
        assert history[step] == pytest.approx(loss, rel=1e-4, abs=1e-5), step
    assert run.data.metrics["val/loss"] == pytest.approx(single["val/loss"], rel=1e-4)
    cfg = validate(compose_config(tiny_overrides(tmp_path, *TRAIN)))
    folder = plan(cfg)["train"].folder
    assert (folder / "draft" / "config.json").exists() and (folder / "manifest.json").exists()


def test_a_killed_torchrun_job_resumes_under_two_processes(tmp_path):
    _, single = one_process_curve(tmp_path)
    cfg = validate(compose_config(tiny_overrides(tmp_path, *TRAIN)))
    latest = plan(cfg)["train"].folder / "checkpoints" / "latest.json"
    proc = torchrun(tmp_path, wait=False)
    deadline = time.monotonic() + 300
    while not latest.exists():  # the first checkpoint (step 2) is written: kill -9 every process of the job
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.05)
    job = psutil.Process(proc.pid)
    for process in [*job.children(recursive=True), job]:  # the workers live in sessions of their own
        process.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (plan(cfg)["train"].folder / "manifest.json").exists()
    again = torchrun(tmp_path)
    assert "train: resuming at" in again.stdout + again.stderr  # continued from the checkpoint, not from zero
    client, runs = mlflow_runs(tmp_path)
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert len(finished) == 1
    assert finished[0].data.metrics["val/loss"] == pytest.approx(single["val/loss"], rel=1e-4)
    assert finished[0].data.metrics["train/steps"] == single["train/steps"]


def test_fsdp_loss_curve_equals_one_process_and_resumes(tmp_path):
    """FSDP2 (fully_shard) on gloo: the same curve, and a job killed after its first checkpoint resumes."""
    curve, single = one_process_curve(tmp_path)
    cfg = validate(compose_config(tiny_overrides(tmp_path, *TRAIN)))
    latest = plan(cfg)["train"].folder / "checkpoints" / "latest.json"
    proc = torchrun(tmp_path, "train.strategy=fsdp", wait=False)
    deadline = time.monotonic() + 300
    while not latest.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.05)
    job = psutil.Process(proc.pid)
    for process in [*job.children(recursive=True), job]:
        process.send_signal(signal.SIGKILL)
    proc.wait()
    again = torchrun(tmp_path, "train.strategy=fsdp")
    assert "train: resuming at" in again.stdout + again.stderr
    client, runs = mlflow_runs(tmp_path)
    run = next(r for r in runs if r.info.status == "FINISHED")
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")}
    for step in sorted(history):
        assert history[step] == pytest.approx(curve[step], rel=1e-4, abs=1e-5), step
    assert run.data.metrics["val/loss"] == pytest.approx(single["val/loss"], rel=1e-4)


def test_fsdp_exports_a_frozen_head_as_one_process_does(tmp_path):
    """train.freeze_lm_head under FSDP2: the best weights leave the frozen head out, and the unsharded draft rank 0
    exports keeps it frozen, so the stage loads them and exports the same head and val/loss as one process."""
    from draftlab.sglang.export import load_draft

    frozen = ("train.freeze_lm_head=true",)
    _, single = one_process_curve(tmp_path, *frozen)
    torchrun(tmp_path, "train.strategy=fsdp", *frozen)
    client, runs = mlflow_runs(tmp_path)
    assert runs[0].data.metrics["val/loss"] == pytest.approx(single["val/loss"], rel=1e-4)
    folders = [plan(validate(compose_config(tiny_overrides(root, *TRAIN, *frozen))))["train"].folder
               for root in (tmp_path / "single", tmp_path)]
    heads = [load_draft(folder / "draft").lm_head.weight for folder in folders]
    assert torch.equal(heads[0], heads[1])

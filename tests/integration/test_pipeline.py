"""The pipeline: content-addressed stage folders, caching, and what MLflow records for a job."""

import json
import shutil

import pytest
from mlflow.tracking import MlflowClient

from draftlab.config.config import validate
from draftlab.pipeline import plan
from draftlab.task import run_task


def test_folders_depend_only_on_what_a_stage_reads(tiny_cfg):
    base = plan(validate(tiny_cfg()))
    more_samples = plan(validate(tiny_cfg("data.samples=64")))
    other_lr = plan(validate(tiny_cfg("train.lr=0.5")))
    other_layers = plan(validate(tiny_cfg("extract.layers=[1,2,3]")))
    assert more_samples["generate"].folder == base["generate"].folder  # a growing pool
    assert more_samples["generate"].key != base["generate"].key
    assert more_samples["train"].folder != base["train"].folder
    assert other_lr["extract"].folder == base["extract"].folder and other_lr["train"].folder != base["train"].folder
    assert other_layers["generate"].folder == base["generate"].folder
    assert other_layers["extract"].folder != base["extract"].folder
    assert other_layers["train"].folder != base["train"].folder


def test_extract_pool_root_moves_the_feature_pool_and_nothing_else(tiny_cfg, tmp_path):
    """The GPU preset keeps the pool in memory (extract.pool_root): same keys, another folder; the later stages
    read it there (train), and a rerun finds it cached."""
    elsewhere = tmp_path / "memory"
    base = plan(validate(tiny_cfg()))
    moved = plan(validate(tiny_cfg(f"extract.pool_root={elsewhere}", "extract.writers=2")))
    assert moved["extract"].folder.relative_to(elsewhere).parts[1:] == ("extract", base["extract"].folder.name)
    other_root = plan(validate(tiny_cfg(f"extract.pool_root={elsewhere}", f"paths.root={tmp_path / 'other'}")))
    assert other_root["extract"].folder != moved["extract"].folder  # a pool of its own for each paths.root
    assert {n: s.key for n, s in moved.items()} == {n: s.key for n, s in base.items()}
    assert all(moved[n].folder == base[n].folder for n in ("generate", "train", "bench"))
    overrides = ("stages=[generate,extract,train]", "data.samples=8", "train.max_steps=2", "tracking.enabled=false",
                 f"extract.pool_root={elsewhere}")
    first = run_task(tiny_cfg(*overrides))
    assert (moved["extract"].folder / "manifest.json").exists() and not base["extract"].folder.exists()
    assert first["train/steps"] == 2
    second = run_task(tiny_cfg(*overrides))
    assert second["extract/cached"] == 1 and second["train/cached"] == 1


def test_online_extract_is_cached_only_when_it_did_no_work(tiny_cfg):
    """Online, extract stores no samples but loads the target and writes its head: the first job's summary must
    not call that cached (it did, from `extract/new_samples` 0); the rerun, which finds the stage's record, is; and
    so is a job at more samples, which runs the stage (another record) but finds its manifest and head."""
    overrides = ("stages=[generate,extract]", "extract.mode=online", "tracking.enabled=false")
    first = run_task(tiny_cfg(*overrides, "data.samples=8"))
    assert first["extract/cached"] == 0 and "extract/new_samples" not in first
    assert run_task(tiny_cfg(*overrides, "data.samples=8"))["extract/cached"] == 1
    more = run_task(tiny_cfg(*overrides, "data.samples=10"))
    assert more["extract/cached"] == 1 and more["extract/new_samples"] == 0


def test_generate_job_is_tracked_and_cached_on_rerun(tiny_cfg, tmp_path):
    cfg = tiny_cfg("stages=[generate]", "data.samples=8")
    first = run_task(cfg)
    second = run_task(cfg)
    assert first["generate/cached"] == 0 and second["generate/cached"] == 1
    client = MlflowClient(tracking_uri=str(cfg.tracking.uri))
    runs = client.search_runs([client.get_experiment_by_name("draftlab").experiment_id],
                              order_by=["attributes.start_time ASC"])
    assert len(runs) == 2
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["data.samples"] == "8" and run.data.params["target.name"] == "tiny"
    assert run.data.tags["git.commit"] and run.data.tags["git.dirty"] in ("true", "false", "unknown")
    assert run.data.tags["fingerprint.generate"]
    # the stage's code hash, which the sweep analysis compares runs on (analysis/codecheck.py)
    assert run.data.tags["code.generate"] == plan(cfg)["generate"].code and len(run.data.tags["code.generate"]) >= 16
    for name in ("generate/seconds", "generate/cached", "generate/samples", "generate/tokens",
                 "generate/tokens_per_s"):
        assert name in run.data.metrics, name
    assert runs[1].data.metrics["generate/cached"] == 1
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "config")]
    assert "config/resolved.yaml" in artifacts


def test_a_failing_stage_marks_the_run_failed(tiny_cfg, monkeypatch):
    from draftlab.stages import generate

    def broken(*args, **kwargs):
        raise RuntimeError("stage exploded")

    monkeypatch.setattr(generate, "run", broken)
    cfg = tiny_cfg("stages=[generate]")
    with pytest.raises(RuntimeError, match="stage exploded"):
        run_task(cfg)
    client = MlflowClient(tracking_uri=str(cfg.tracking.uri))
    run = client.search_runs([client.get_experiment_by_name("draftlab").experiment_id])[0]
    assert run.info.status == "FAILED"


def test_a_stage_without_its_inputs_says_which(tiny_cfg):
    with pytest.raises(RuntimeError, match="needs generate"):
        run_task(tiny_cfg("stages=[extract]", "tracking.enabled=false"))


def test_untracked_jobs_leave_results_that_import_as_a_sweep(tiny_cfg, tmp_path):
    from draftlab.tracking.import_runs import import_runs

    from draftlab.tracking.mlflow_source import load_records

    for samples in (8, 16):
        job = tmp_path / "multirun" / str(samples)
        run_task(tiny_cfg("stages=[generate,extract,train]", f"data.samples={samples}", "data.val_samples=4",
                          "tracking.enabled=false", "train.log_every=1"), output_dir=job)
        assert (job / "results.json").exists()
        shutil.rmtree(json.loads((job / "results.json").read_text())["tags"]["folder.train"])  # another machine's
    uri = f"sqlite:///{tmp_path / 'imported.db'}"
    parent = import_runs(tmp_path / "multirun", "imported", uri, records=tmp_path / "records.jsonl.gz")
    client = MlflowClient(tracking_uri=uri)
    children = client.search_runs([client.get_experiment_by_name("imported").experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent}'")
    assert sorted(int(c.data.params["data.samples"]) for c in children) == [8, 16]
    assert all(c.data.metrics["generate/samples"] == int(c.data.params["data.samples"]) + 4 for c in children)
    # the curves come along: every validation pass at its step, the final value still the latest
    for child in children:
        job = json.loads((tmp_path / "multirun" / child.info.run_name / "results.json").read_text())
        last = max(s for pairs in job["history"].values() for s, _ in pairs)
        for key in ("val/acc_0", "train/loss"):
            logged = {(m.step, m.value) for m in client.get_metric_history(child.info.run_id, key)}
            assert logged == {tuple(p) for p in job["history"][key]} | {(last, job["metrics"][key])}, key
            assert child.data.metrics[key] == job["metrics"][key]
        if child.info.run_name == "16":  # two steps: a curve, not a point
            assert [s for s, _ in job["history"]["train/loss"]] == [1, 2]
    # the per-sample validation results travel with the jobs: one validation set for both sizes
    records = load_records(parent, uri).records
    assert [r["val_samples"]["index"] for r in records] == [[0.0, 1.0, 2.0, 3.0]] * 2
    # the same jobs as one records file for `analyze.py --records`, each run named by its job folder
    from draftlab.analysis.records import read_records

    written = read_records(tmp_path / "records.jsonl.gz")
    assert [r["run_id"] for r in written] == ["16", "8"]
    assert written[1] == {"run_id": "8", **json.loads((tmp_path / "multirun" / "8" / "results.json").read_text())}


def test_import_refuses_a_history_that_is_not_step_value_pairs(tmp_path):
    from draftlab.tracking.import_runs import import_runs

    job = tmp_path / "multirun" / "0"
    job.mkdir(parents=True)
    (job / "results.json").write_text(json.dumps({"params": {}, "metrics": {}, "history": {"val/loss": [[0.5, 2.0]]}}))
    with pytest.raises(ValueError, match=r"0/results.json: history.val/loss is not a list of \[step, value\] pairs"):
        import_runs(tmp_path / "multirun", "imported", f"sqlite:///{tmp_path / 'never.db'}")
    assert not (tmp_path / "never.db").exists()  # refused before the store was opened


def test_a_train_folder_carried_to_another_root_is_benched_without_extracting(tiny_cfg, tmp_path):
    """benchmarks/gpu/serve.sh split over two machines: the second carries the first's train folder (no
    checkpoints), generates again (the same key) and benches it with stages=[generate,bench]."""
    common = ("data.samples=8", "train.max_steps=2", "tracking.enabled=false")
    run_task(tiny_cfg(*common, "stages=[generate,extract,train]"))
    here = plan(validate(tiny_cfg(*common)))
    there = plan(validate(tiny_cfg(*common, f"paths.root={tmp_path / 'there'}")))
    assert {n: s.key for n, s in there.items()} == {n: s.key for n, s in here.items()}
    shutil.copytree(here["train"].folder, there["train"].folder, ignore=shutil.ignore_patterns("checkpoints"))
    benched = run_task(tiny_cfg(*common, f"paths.root={tmp_path / 'there'}", "stages=[generate,bench]"))
    assert benched["bench/cached"] == 0 and "bench/tau" in benched
    assert not there["extract"].folder.exists()


def test_epochs_sweep_continues_from_the_shorter_run(tiny_cfg, caplog):
    """`train.init_from=shorter` (experiment=epochs): a 2-epoch job continues the finished 1-epoch job and,
    with a constant schedule, ends where a 2-epoch run from scratch ends."""
    import logging

    common = ("train.schedule=constant", "train.warmup_ratio=0.0", "tracking.enabled=false",
              "stages=[generate,extract,train]")
    run_task(tiny_cfg(*common, "train.epochs=1", "train.init_from=shorter"))
    with caplog.at_level(logging.INFO, logger="draftlab.pipeline"):
        continued = run_task(tiny_cfg(*common, "train.epochs=2", "train.init_from=shorter"))
    assert "continuing from the 1-epoch run" in caplog.text
    scratch = run_task(tiny_cfg(*common, "train.epochs=2"))
    assert continued["train/steps"] == scratch["train/steps"]
    assert continued["val/loss"] == pytest.approx(scratch["val/loss"], rel=1e-5)


def test_a_stage_names_the_gpu_it_ran_on(monkeypatch):
    """The device of a completion record: a GPU by name and SM count once a stage initialised CUDA, "no GPU work"
    where it did not on a GPU machine, else cpu."""
    import sys
    from types import SimpleNamespace

    from draftlab import pipeline

    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", multi_processor_count=132)
    cuda = SimpleNamespace(is_initialized=lambda: True, is_available=lambda: True, current_device=lambda: 0,
                           get_device_properties=lambda i: props)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    assert pipeline._device() == "NVIDIA H100 80GB HBM3 (132 SMs)"
    cuda.is_initialized = lambda: False  # a GPU there, but the stage found its work done
    assert pipeline._device() == "no GPU work"
    cuda.is_available = lambda: False
    assert pipeline._device() == "cpu"

"""Tracking faults: a bad store is refused up front naming `tracking.uri`; a store that fails
mid-run costs no training; a killed job's run is closed by the rerun; a resumed job's run holds the whole curve.
Also the experiment kind that makes MLflow's UI open on training runs."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO
from draftlab.config.config import ConfigError, validate
from draftlab.util.fsutil import read_json
from draftlab.tracking.store import StoreError
from draftlab.tracking.runs import open_store
from draftlab.task import run_task
from draftlab.tracking.runs import tracked_run


def _runs(uri, experiment="draftlab"):
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def test_unreachable_server_is_refused_at_once_naming_the_key(tiny_cfg, tmp_path):
    cfg = tiny_cfg("stages=[generate]", "tracking.uri=http://127.0.0.1:9")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"^tracking\.uri: cannot reach .*127\.0\.0\.1:9"):
        run_task(cfg)
    assert time.monotonic() - started < 15
    assert not (tmp_path / "out" / "generate").exists()  # refused before any stage ran


def test_a_server_that_never_answers_is_refused_after_the_timeout():
    silent = socket.socket()  # accepts connections (the kernel's backlog) and never answers a request
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
    started = time.monotonic()
    try:
        with pytest.raises(StoreError, match="tracking.uri: .* gave no answer within 2 s"):
            open_store(uri, timeout=2.0)
    finally:
        silent.close()
    assert time.monotonic() - started < 8


def test_read_only_sqlite_store_is_refused_quickly(tmp_path):
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    open_store(f"sqlite:///{db}")  # a real store, with its tables
    started = time.monotonic()
    # the store opened read-only (as a read-only mount or file would be): SQLite's own URI form
    with pytest.raises(StoreError, match=r"tracking\.uri: the SQLite store .*mlflow\.db cannot be written"):
        open_store(f"sqlite:///file:{db}?mode=ro&uri=true")
    assert time.monotonic() - started < 5


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files; the mode=ro test covers root")
def test_read_only_sqlite_file_is_refused_quickly(tmp_path):
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    open_store(f"sqlite:///{db}")
    os.chmod(db, 0o444)
    os.chmod(db.parent, 0o555)
    open_store.cache_clear()  # a client is kept per URI: check this one again
    started = time.monotonic()
    try:
        with pytest.raises(StoreError, match=r"tracking\.uri: .* (read-only|cannot be written)"):
            open_store(f"sqlite:///{db}")
    finally:
        os.chmod(db.parent, 0o755)
    assert time.monotonic() - started < 5


def test_sqlite_store_in_a_missing_folder_is_refused_not_made(tiny_cfg, tmp_path):
    """A mistyped store path would start a second store and split the runs across two without a word."""
    typo = tmp_path / "nonexistent_dir" / "deeper"
    with pytest.raises(StoreError, match=r"^tracking\.uri: the folder .*deeper of the SQLite store does not exist"):
        open_store(f"sqlite:///{typo / 'mlflow.db'}")
    cfg = tiny_cfg("stages=[generate]", f"tracking.uri=sqlite:///{typo / 'mlflow.db'}")
    with pytest.raises(ConfigError, match=r"^tracking\.uri: "):
        run_task(cfg)
    assert not (tmp_path / "nonexistent_dir").exists() and not (tmp_path / "out" / "generate").exists()


def test_the_default_store_folder_is_still_made(tmp_path, monkeypatch):
    from draftlab.tracking.run_context import tracking_uri
    from draftlab.tracking.store import check_reachable

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = tracking_uri(None)
    assert uri == f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    (tmp_path / "mlruns").rmdir()  # removed between runs: made again, as the default
    check_reachable(uri)
    assert (tmp_path / "mlruns").is_dir()


class FlakyClient:
    """A real client whose metric logging fails for a while, as a store on a full disk does."""

    def __init__(self, inner, fail_calls: range):
        self.inner, self.fail_calls, self.calls, self.attempted = inner, fail_calls, 0, []

    def log_batch(self, run_id, metrics=(), **kwargs):
        if metrics:
            self.calls += 1
            self.attempted.extend((m.key, m.step, m.value) for m in metrics)
            if self.calls in self.fail_calls:
                raise OSError(28, "No space left on device")
        return self.inner.log_batch(run_id, metrics=metrics, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_metric_logging_failures_during_training_cost_nothing(tiny_cfg, monkeypatch, caplog):
    import draftlab.tracking.runs as tracking

    cfg = tiny_cfg("stages=[generate,extract,train]", "train.epochs=2", "train.log_every=1")
    uri = str(cfg.tracking.uri)
    flaky = FlakyClient(open_store(uri), fail_calls=range(4, 9))  # fails from generate's end into training
    monkeypatch.setattr(tracking, "_client", lambda _uri: flaky)
    monkeypatch.setattr(tracking, "RETRY_EVERY_S", 0.0)  # retry at every log point (a real run waits 30 s)
    results = run_task(cfg)
    assert results["train/steps"] > 0
    assert "could not log to run" in caplog.text and "answers again" in caplog.text
    client, runs = _runs(uri)
    assert [r.info.status for r in runs] == ["FINISHED"]
    run_id = runs[0].info.run_id
    stored = {(m.key, m.step, m.value) for key in {k for k, _, _ in flaky.attempted}
              for m in client.get_metric_history(run_id, key)}
    assert set(flaky.attempted) == stored  # every value, failed attempts included, is in the store


def test_a_store_that_never_recovers_still_finishes_the_job(tiny_cfg, monkeypatch, tmp_path):
    import draftlab.tracking.runs as tracking

    cfg = tiny_cfg("stages=[generate]")
    flaky = FlakyClient(open_store(str(cfg.tracking.uri)), fail_calls=range(1, 10**6))
    monkeypatch.setattr(tracking, "_client", lambda _uri: flaky)
    results = run_task(cfg, output_dir=tmp_path / "job")
    assert results["generate/samples"] == 32
    assert (tmp_path / "job" / "results.json").exists()  # the numbers survive for import-runs


KILLED_JOB = """
import os, signal, sys
sys.path.insert(0, {src!r})
from conftest import compose_config, tiny_overrides
from draftlab.config.config import validate
from draftlab.tracking.runs import tracked_run
from pathlib import Path
cfg = validate(compose_config(tiny_overrides(Path({tmp!r}), "stages=[generate]")))
with tracked_run(cfg) as reporter:
    reporter.metrics({{"x": 1.0}})
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_rerun_of_a_killed_job_closes_its_run_as_killed(tiny_cfg, tmp_path):
    code = KILLED_JOB.format(src=str(REPO / "src"), tmp=str(tmp_path))
    killed = subprocess.run([sys.executable, "-c", code], cwd=REPO / "tests", capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO / 'tests'}"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    cfg = validate(tiny_cfg("stages=[generate]"))
    uri = str(cfg.tracking.uri)
    _, runs = _runs(uri)
    assert [r.info.status for r in runs] == ["RUNNING"]
    orphan = runs[0].info.run_id

    other = validate(tiny_cfg("stages=[generate]", "data.samples=8"))  # another job: its orphans are not ours
    with tracked_run(other):
        pass
    client, runs = _runs(uri)
    assert client.get_run(orphan).info.status == "RUNNING"

    with tracked_run(cfg):
        assert client.get_run(orphan).info.status == "KILLED"
        with tracked_run(cfg):  # the same job twice at once: the live run is never taken for an orphan
            pass
        assert [r.info.status for r in _runs(uri)[1]].count("RUNNING") == 1
    assert sorted(r.info.status for r in _runs(uri)[1]) == ["FINISHED", "FINISHED", "FINISHED", "KILLED"]


def test_a_resumed_training_job_logs_the_whole_curve(tiny_cfg, monkeypatch):
    from draftlab.train.loop import Trainer

    overrides = ("stages=[generate,extract,train]", "train.epochs=3", "train.checkpoint_every=100000")
    cfg = tiny_cfg(*overrides)
    real_end_epoch = Trainer._end_epoch

    def end_epoch_then_die(self):
        real_end_epoch(self)  # validates, then writes the epoch's checkpoint
        if self.state["epoch"] == 2:  # two epochs done: die right after their checkpoint is written
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(Trainer, "_end_epoch", end_epoch_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_task(cfg)
    monkeypatch.setattr(Trainer, "_end_epoch", real_end_epoch)
    results = run_task(tiny_cfg(*overrides))
    client, runs = _runs(str(cfg.tracking.uri))
    assert [r.info.status for r in runs] == ["FAILED", "FINISHED"]
    curve = {m.step: m.value for m in client.get_metric_history(runs[1].info.run_id, "val/loss")}
    history = read_json(Path(runs[1].data.tags["folder.train"]) / "manifest.json")["history"]
    assert curve == {int(h["step"]): pytest.approx(h["val/loss"]) for h in history}  # all 3 epochs, not 1
    assert len(curve) == 3 and curve[max(curve)] == pytest.approx(results["val/loss"])


def test_experiments_open_on_training_runs_in_the_ui(tiny_cfg):
    cfg = validate(tiny_cfg("stages=[generate]"))
    with tracked_run(cfg):
        pass
    client = MlflowClient(tracking_uri=str(cfg.tracking.uri))
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_a_failing_store_is_retried_with_backoff_not_at_every_log_point(monkeypatch):
    import draftlab.tracking.runs as tracking

    class Dead:
        calls = 0

        def log_batch(self, *args, **kwargs):
            Dead.calls += 1
            raise OSError(28, "No space left on device")

    reporter = tracking.MlflowReporter(Dead(), "run")
    for step in range(50):
        reporter.metrics({"train/loss": 1.0}, step=step)
    assert Dead.calls == 1 and len(reporter.pending) == 50  # kept, tried once: a hanging store costs one wait
    assert not reporter.flush(force=True) and Dead.calls == 2  # the run's end tries again regardless



@pytest.mark.parametrize("multirun", [False, True])
def test_cli_refuses_an_unreachable_store_in_one_line(tmp_path, multirun):
    command = [sys.executable, str(REPO / "src" / "run.py"), *(["-m"] if multirun else []), "target=tiny",
               "data.samples=8", "bench.prompts=1", "tracking.uri=http://127.0.0.1:9", f"paths.root={tmp_path}"]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert time.monotonic() - started < 15
    assert result.returncode == 2
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "tracking.uri" in line]
    assert len(errors) == 1 and "config error: tracking.uri: cannot reach" in errors[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "multirun").exists() and not (tmp_path / "generate").exists()

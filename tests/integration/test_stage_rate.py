"""benchmarks/stage_rate.py reads the train stage's steady rate off a job's log: the trainer's own validation lines, in
Hydra's default log format, timed by a fake clock (each step 1 s, each pass 2.5 s), give back the tokens a step
over one second once the passes are left out; a span without its passes logged is refused with the steps it has."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import types
from pathlib import Path

import hydra
import pytest
from omegaconf import OmegaConf

from conftest import BENCHMARKS, benchmark_script
from draftlab.util.reporting import RecordingReporter
from draftlab.train import loop, scored
from draftlab.train.loop import Trainer
from test_train_loop import FakeSource, _model, _settings
from test_train_progress import Clock

stage_rate = benchmark_script("stage_rate")
EPOCH_START = 1_764_900_000.0  # the log's first second (any fixed time)


class FakeTimes(logging.Handler):
    """Formats each draftlab record as Hydra's job log does, stamped with the fake clock's time."""

    def __init__(self, clock: Clock) -> None:
        default = Path(hydra.__file__).parent / "conf" / "hydra" / "job_logging" / "default.yaml"
        super().__init__()
        self.setFormatter(logging.Formatter(OmegaConf.load(default).formatters.simple.format))
        self.clock, self.lines = clock, []

    def emit(self, record: logging.LogRecord) -> None:
        record.created = EPOCH_START + self.clock.now
        record.msecs = (record.created % 1) * 1000
        self.lines.append(self.format(record))


def _trained_log(tmp_path, monkeypatch) -> tuple[str, dict, int]:
    clock = Clock()
    fake_time = types.SimpleNamespace(perf_counter=clock.perf_counter)
    monkeypatch.setattr(loop, "time", fake_time)
    monkeypatch.setattr(scored, "time", fake_time)  # it times the validation passes
    source = FakeSource()
    trainer = Trainer(_model(source), source, source.lm_head, _settings(epochs=4, eval_every=2, log_every=2),
                      tmp_path / "ckpt", RecordingReporter())
    step, evaluate = trainer._train_step, trainer.evaluate

    def timed_step(*args):
        step(*args)
        clock.now += 1.0

    def timed_evaluate(*args):
        clock.now += 2.5
        return evaluate(*args)

    monkeypatch.setattr(trainer, "_train_step", timed_step)
    monkeypatch.setattr(trainer, "evaluate", timed_evaluate)
    handler, logger = FakeTimes(clock), logging.getLogger("draftlab")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # as a job's log config sets it
    try:
        result = trainer.run()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    final = result.final
    metrics = {"train/train_tokens": float(source.num_tokens("train")), "train/epochs_seen": final["train/epochs_seen"],
               "train/steps": float(result.steps)}
    return "\n".join(handler.lines) + "\n", metrics, result.steps


def test_the_rate_between_passes_is_the_steps_tokens_over_their_seconds(tmp_path, monkeypatch):
    text, metrics, steps = _trained_log(tmp_path, monkeypatch)
    logged = stage_rate.passes(text)
    assert sorted(logged) == list(range(2, steps + 1, 2)) and all(s == 2.5 for _, s in logged.values()), logged
    per_step = metrics["train/train_tokens"] * metrics["train/epochs_seen"] / metrics["train/steps"]
    row = stage_rate.steady_rate(text, metrics)
    assert (row["first"], row["last"]) == (4, steps)  # the second pass to the last
    assert row["passes_s"] == pytest.approx(2.5 * (steps - 4) / 2)
    assert row["tokens_per_s"] == pytest.approx(per_step, rel=1e-3)  # one step a second, passes left out
    assert row["tokens_per_s_with_passes"] < row["tokens_per_s"]
    chosen = stage_rate.steady_rate(text, metrics, first=2, last=6)
    assert (chosen["span_s"], chosen["passes_s"]) == (pytest.approx(4 + 2 * 2.5, abs=2e-3), 5.0)
    with pytest.raises(ValueError, match=r"no validation pass logged at step 3 \(passes at \[2, 4"):
        stage_rate.steady_rate(text, metrics, first=3)
    with pytest.raises(ValueError, match="two are needed"):
        stage_rate.steady_rate(text.split("\n")[0], metrics)


def test_the_command_reads_a_packed_job_folder(tmp_path, monkeypatch):
    text, metrics, _ = _trained_log(tmp_path, monkeypatch)
    job = tmp_path / "small_new_0"  # a packed job: log-small.txt, small/results.json
    (job / "small").mkdir(parents=True)
    (job / "log-small.txt").write_text(text)
    (job / "small" / "results.json").write_text(json.dumps({"metrics": metrics}))
    out = subprocess.run([sys.executable, str(BENCHMARKS / "stage_rate.py"), str(job), "--stated", "1",
                          "--json", str(tmp_path / "rates.jsonl")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    row = json.loads((tmp_path / "rates.jsonl").read_text())
    assert row["run"] == "small_new_0" and f"median {row['tokens_per_s']:.0f} tok/s" in out.stdout
    missing = subprocess.run([sys.executable, str(BENCHMARKS / "stage_rate.py"), str(tmp_path / "ckpt")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "needs results.json" in missing.stderr

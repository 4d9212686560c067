"""bench/issue_stage.py reads the issue's train stage window by window: records in the shape 5c67ce0's trainer
reports them (a window every 10 steps, a validation pass at each epoch's end, the stage's closing metrics) give back
the last full window's rate, and a steady rate that leaves out each window holding a start or an epoch's end."""

from __future__ import annotations

import json

import pytest

from conftest import bench_script

issue_stage = bench_script("issue_stage")


def _records() -> list[dict]:
    """Two epochs of 30 steps: windows of 10 steps, 8,000 tokens at 1 s each, except each epoch's first window,
    which took 5 s (the start; then the validation pass and checkpoint), and a short 4-step window at the end."""
    records, t = [], 0.0
    for epoch in range(2):
        for window in range(3):
            seconds = 5.0 if window == 0 else 1.0
            t += seconds
            records.append({"t": t, "step": epoch * 30 + 10 * (window + 1), "epoch": float(epoch),
                            "train/tokens": 8000.0, "train/tokens_per_s": 8000.0 / seconds})
        t += 0.4
        records.append({"t": t, "step": epoch * 30 + 34, "epoch": float(epoch), "train/tokens": 3200.0,
                        "train/tokens_per_s": 3200.0 / 0.4})
        records.append({"t": t + 2.0, "step": epoch * 30 + 34, "epoch": float(epoch), "val/loss": 9.0})
    records.append({"t": t + 3.0, "step": 68, "train/tokens_per_s": 8000.0, "train/seconds": 25.0})
    return records


def test_readings_leave_out_the_windows_that_hold_a_start_or_an_epoch_end():
    found = issue_stage.readings(_records(), {"train/train_tokens": 27_200.0, "train/seconds": 25.0})
    assert found["windows"] == 8  # the closing metrics are not a window
    assert found["last_window"] == pytest.approx(8000.0)  # the short window at the end is not the last full one
    assert found["median_window"] == pytest.approx(8000.0)
    # two epochs x (2 windows of 8,000 tokens in 1 s + 3,200 in 0.4 s): 38,400 tokens in 4.8 s
    assert found["steady"] == pytest.approx(8000.0)
    assert found["stage_mean"] == pytest.approx(27_200.0 * 2 / 25.0)


def test_a_slow_window_inside_an_epoch_stays_in_the_steady_rate():
    records = _records()
    records[1]["train/tokens_per_s"] = 4000.0  # a checkpoint inside the epoch: 2 s for that window
    found = issue_stage.readings(records)
    assert found["steady"] == pytest.approx(38_400.0 / 5.8)
    assert "stage_mean" not in found


def test_records_without_windows_are_refused():
    with pytest.raises(ValueError, match="no train log windows"):
        issue_stage.readings([{"t": 0.0, "step": 5, "val/loss": 9.0}])


def test_an_issue_stage_folder_is_read_from_its_windows_and_results(tmp_path):
    (tmp_path / "issue_3.jsonl").write_text("\n".join(json.dumps(r) for r in _records()) + "\n")
    (tmp_path / "issue_run_3").mkdir()
    (tmp_path / "issue_run_3" / "results.json").write_text(
        json.dumps({"metrics": {"train/train_tokens": 27_200.0, "train/seconds": 25.0}}))
    assert issue_stage.issue_readings(tmp_path) == issue_stage.readings(
        _records(), {"train/train_tokens": 27_200.0, "train/seconds": 25.0})
    (tmp_path / "issue_4.jsonl").write_text("")
    with pytest.raises(SystemExit, match="needs one issue_"):
        issue_stage.issue_readings(tmp_path)

"""bench/issue_stage.py reads the issue's train stage window by window: records in the shape 5c67ce0's trainer
reports them (a window every 10 steps, a validation pass at each epoch's end, the stage's closing metrics), stamped
with the time each was reported, give back the last window's rate, a steady rate that leaves out each window holding
a start or an epoch's end, and the last epoch's rate; today's stage is timed from its log's stage lines."""

from __future__ import annotations

import json

import pytest

from conftest import bench_script

issue_stage = bench_script("issue_stage")


def _records(slow: dict[tuple[int, int], float] | None = None) -> list[dict]:
    """Two epochs of 34 steps: windows of 10 steps, 8,000 tokens in 1 s each (or the seconds `slow` gives for
    (epoch, window)), except each epoch's first window, which took 5 s (the start; then the pass and checkpoint),
    and a short 4-step window of 3,200 tokens in 0.4 s at each epoch's end; the pass is reported 2 s after it.
    `train/tokens` holds loss positions (half the tokens here, a quarter in a slow window), as 5c67ce0's summary
    does: the reading must not use it."""
    records, t, slow = [], 0.0, slow or {}
    for epoch in range(2):
        for window in range(3):
            seconds = slow.get((epoch, window), 5.0 if window == 0 else 1.0)
            t += seconds
            records.append({"t": t, "step": epoch * 34 + 10 * (window + 1), "epoch": float(epoch),
                            "train/tokens": 1000.0 if (epoch, window) in slow else 4000.0,
                            "train/tokens_per_s": 8000.0 / seconds})
        t += 0.4
        records.append({"t": t, "step": epoch * 34 + 34, "epoch": float(epoch), "train/tokens": 1600.0,
                        "train/tokens_per_s": 3200.0 / 0.4})
        t += 2.0
        records.append({"t": t, "step": epoch * 34 + 34, "epoch": float(epoch), "val/loss": 9.0})
    records.append({"t": t + 1.0, "step": 68, "train/tokens_per_s": 8000.0, "train/seconds": 25.0})
    return records


def test_readings_leave_out_the_windows_that_hold_a_start_or_an_epoch_end():
    found = issue_stage.readings(_records(), {"train/train_tokens": 27_200.0, "train/seconds": 25.0})
    assert found["windows"] == 8  # the closing metrics are not a window
    assert found["last_window"] == pytest.approx(8000.0)
    assert found["median_window"] == pytest.approx(8000.0)
    # two epochs x (2 windows of 8,000 tokens in 1 s + 3,200 in 0.4 s): 38,400 tokens in 4.8 s
    assert found["steady"] == pytest.approx(8000.0)
    assert found["late"] == pytest.approx(8000.0)
    assert found["stage_mean"] == pytest.approx(27_200.0 * 2 / 25.0)  # two epochs seen in the records


def test_a_slow_window_counts_by_its_seconds_and_the_late_rate_reads_the_last_epoch_alone():
    found = issue_stage.readings(_records(slow={(0, 1): 2.0}))  # a checkpoint inside epoch 0: 8,000 tokens in 2 s
    assert found["steady"] == pytest.approx(38_400.0 / 5.8)
    assert found["late"] == pytest.approx(19_200.0 / 2.4)  # epoch 1: its second and third windows and its short one
    assert "stage_mean" not in found


def test_records_without_windows_are_refused():
    with pytest.raises(ValueError, match="no train log windows"):
        issue_stage.readings([{"t": 0.0, "step": 5, "val/loss": 9.0}])


def test_an_issue_stage_folder_is_read_from_its_windows_and_results(tmp_path):
    results = {"train/train_tokens": 27_200.0, "train/seconds": 25.0}
    (tmp_path / "issue_3.jsonl").write_text("\n".join(json.dumps(r) for r in _records()) + "\n")
    (tmp_path / "issue_run_3").mkdir()
    (tmp_path / "issue_run_3" / "results.json").write_text(json.dumps({"metrics": results}))
    assert issue_stage.issue_readings(tmp_path) == issue_stage.readings(_records(), results)
    (tmp_path / "issue_4.jsonl").write_text("")
    with pytest.raises(SystemExit, match="needs one issue_"):
        issue_stage.issue_readings(tmp_path)


def test_todays_stage_is_timed_from_its_running_line_to_the_next_stages():
    log = ("[2026-12-05 10:10:04,223][draftlab.pipeline][INFO] - stage extract: running in /x\n"
           "[2026-12-05 10:10:05,000][draftlab.pipeline][INFO] - stage train: running in /tmp/dl/train/6a2c\n"
           "[2026-12-05 10:10:30,000][draftlab][INFO] - train: step 100 val/loss 18.5 ...\n"
           "[2026-12-05 10:11:09,500][draftlab.pipeline][INFO] - stage bench: running in /tmp/dl/bench/bcb5\n")
    assert issue_stage.stage_seconds(log) == pytest.approx(64.5)
    assert issue_stage.stage_seconds(log.rsplit("\n", 2)[0]) is None  # no stage after train: no span

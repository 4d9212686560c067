"""Known-answer tests of the steps axis: under-trained vs data-limited, the steps confound, and prices.

The truth of each synthetic sweep is set by construction: a joint law L(N, S) = L_inf + A (N/N0)^-a + B (S/S0)^-b
on a grid of data sizes x step budgets, or the measured tables of issue 10.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import REPO
from draftlab.analysis.core import analyze

SIZES = (1600, 3200, 6400)
BUDGETS = (400, 800, 1600)


def grid_record(samples, steps, loss, seed=0, converged=False, **metrics):
    m = {"train/train_tokens": samples * 160.0, "best/val_loss": loss, "train/loss": loss - 0.1,
         "train/steps": steps, "train/stopped_early": float(converged), **metrics}
    p = {"data.samples": samples, "train.max_steps": steps, "train.seed": seed, "train.schedule": "wsd"}
    return {"params": {k: str(v) for k, v in p.items()}, "metrics": m}


def joint(n, s, a, b):
    return 10.0 + a * (n / 1600) ** -0.5 + b * (s / 400) ** -0.6


def grid(a, b, noise=0.02, seeds=(0, 1), rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    return [grid_record(n, s, joint(n, s, a, b) + rng.normal(0, noise), seed=sd)
            for n in SIZES for s in BUDGETS for sd in seeds]


def test_grid_where_steps_dominate_is_under_trained():
    result = analyze(grid(a=0.5, b=8.0))
    assert result.tag == "under-trained", result.report
    steps = result.axes["best/val_loss"].steps
    truth = 8.0 * (4**-0.6 - 8**-0.6)  # the next doubling, 1600 -> 3200 steps
    assert steps.gain.lo <= truth <= steps.gain.hi and steps.fit is not None and steps.fit.ok
    assert result.numbers["analysis/verdict_code"] == 3.0
    assert result.numbers["analysis/loss_steps_gain_2x"] > 0.5


def test_grid_where_steps_saturate_and_data_helps_is_data_limited():
    result = analyze(grid(a=6.0, b=0.005))
    assert result.tag == "data-limited", result.report
    data = result.axes["best/val_loss"].data
    assert data.name == "data@steps" and data.held == "S=1600 steps"
    truth = 6.0 * (4**-0.5 - 8**-0.5)
    assert data.gain.lo <= truth <= data.gain.hi
    assert result.details.steps_state == "flat"


def test_grid_where_both_axes_are_flat_is_not_under_trained_nor_data_limited():
    result = analyze(grid(a=0.005, b=0.005))
    assert result.verdict == "bottleneck", result.report  # flat data at convergence, small train/val gap
    assert result.details.steps_state == "flat" and result.details.data_state == "flat"


# issue 10's controlled rerun on one H200 (samples, epochs, steps, val/loss, val/acc_0, predicted tau, bench tau)
ISSUE_TABLE = [(6400, 4, 380, 14.24, 0.446, 1.80, 1.63), (3200, 8, 384, 14.49, 0.438, 1.78, 1.58),
               (1600, 16, 384, 15.03, 0.417, 1.73, None), (6400, 16, 1520, 11.04, 0.582, 2.31, 1.99),
               (3200, 32, 1536, 12.01, 0.534, 2.12, None)]
# stage speeds measured in that sweep (benchmarks/results/h200_data_scaling_jobs.jsonl, job sweep/0)
H200 = {"generate/seconds": 98.83, "generate/new_samples": 6656, "extract/seconds": 19.27,
        "extract/new_samples": 6400}


def issue_records(rows=ISSUE_TABLE):
    out = []
    for i, (n, epochs, steps, loss, acc, ptau, btau) in enumerate(rows):
        m = {"train/train_tokens": n * 160.4, "best/val_loss": loss, "val/acc_0": acc, "val/predicted_tau": ptau,
             "train/steps": steps, "train/seconds": 87.47 / 380 * steps, **(H200 if i == 0 else {})}
        if btau is not None:
            m["bench/tau"] = btau
        out.append({"params": {"data.samples": str(n), "train.epochs": str(epochs), "train.seed": "0"},
                    "metrics": m})
    return out


def test_issue_table_is_under_trained(tmp_path):
    result = analyze(issue_records(), tmp_path)
    assert result.tag == "under-trained", result.report
    loss = result.axes["best/val_loss"]
    # 380 -> 1520 steps on 6,400 samples: 3.2 in loss over two doublings; one seed, so the noise is assumed
    assert loss.steps.gain.value == pytest.approx(3.2 / 2, abs=0.01) and loss.steps.gain.lo > 1.0
    assert loss.noise_source == "assumed"
    assert "2x steps" in result.answer and "2x data" in result.answer and "GPU-s" in result.answer
    assert result.paths["steps_vs_data"].exists()


def test_issue_table_at_380_steps_is_not_data_limited():
    """The fixed-epoch report's reading: three sizes at ~380 steps, no steps axis. Not data-limited."""
    result = analyze(issue_records([r for r in ISSUE_TABLE if r[2] < 400]))
    assert result.verdict != "data-limited" and result.verdict == "undetermined", result.report
    assert "not at convergence" in result.report


def test_old_fixed_epoch_sweep_names_the_steps_confound():
    records = []
    for line in (REPO / "benchmarks" / "results" / "h200_data_scaling_jobs.jsonl").read_text().splitlines():
        job = json.loads(line)
        records.append({"run_id": job["job"], "metrics": job["metrics"],
                        "params": {"data.samples": job["data.samples"], "train.seed": job["train.seed"],
                                   "train.epochs": 4}})
    result = analyze(records)
    assert result.verdict == "undetermined" and result.verdict != "data-limited", result.report
    assert "steps confound" in result.headline


def test_prices_come_from_measured_stage_seconds():
    """2x steps costs the steps it adds; 2x data costs new samples plus a run at the same steps."""
    records = grid(a=0.5, b=8.0)
    for r in records:
        r["metrics"].update({"train/seconds": 0.5 * r["metrics"]["train/steps"]})
    records[0]["metrics"].update({"generate/seconds": 640.0, "generate/new_samples": 6400,
                                  "extract/seconds": 64.0, "extract/new_samples": 6400})
    result = analyze(records)
    ax = result.axes["best/val_loss"]
    assert ax.costs == pytest.approx({"train_s_per_step": 0.5, "generate_s_per_sample": 0.1,
                                      "extract_s_per_sample": 0.01})
    assert ax.steps.seconds == pytest.approx(1600 * 0.5)  # 1600 -> 3200 steps, trained on from the checkpoint
    assert ax.data.seconds == pytest.approx(6400 * 0.11 + 1600 * 0.5)
    assert result.numbers["analysis/loss_steps_cost_2x_s"] == pytest.approx(800.0)
    assert "s per" in result.answer


def test_converged_runs_with_different_steps_are_replicates_of_one_cell():
    """Early-stopped seeds stop at different steps; they still measure the same (N, converged) cell."""
    rng = np.random.default_rng(3)
    records = [grid_record(n, 300 + 40 * sd + n // 20, 10.0 + 6.0 * (n / 1600) ** -0.5 + rng.normal(0, 0.01),
                           seed=sd, converged=True) for n in (800, *SIZES) for sd in (0, 1)]
    result = analyze(records)
    ax = result.axes["best/val_loss"]
    assert ax.noise_source == "seeds" and ax.df == 4 and ax.steps is None
    assert ax.data.name == "data@convergence" and result.tag == "data-limited", result.report


def test_runs_that_hit_the_step_cap_are_named_and_left_off_the_converged_axis():
    """The early-stopping record: a run with early stopping on that reached train.max_steps was still improving."""
    rng = np.random.default_rng(4)
    records = [grid_record(n, 300 + n // 20, 10.0 + 6.0 * (n / 1600) ** -0.5 + rng.normal(0, 0.01), seed=sd,
                           converged=True) for n in (800, *SIZES) for sd in (0, 1)]
    records += [grid_record(12800, 4000, 10.2, seed=sd) for sd in (0, 1)]  # capped: stopped_early = 0
    for r in records:
        r["params"]["train.early_stop_patience"] = "4"
        r["params"]["train.max_steps"] = "4000"
    result = analyze(records)
    ax = result.axes["best/val_loss"]
    assert ax.capped == [12800 * 160.0] and ax.data.x_max == 6400 * 160.0
    assert result.tag == "data-limited" and "still improving at the step cap" in result.report
    assert any("raise train.max_steps" in s for s in result.next_steps)


def test_a_cached_stage_is_priced_at_what_its_maker_paid():
    """A job that reused the pool reports its maker's new samples beside its own ~0 s: not a price of 0."""
    records = grid(a=0.5, b=8.0)
    records[0]["metrics"].update({"generate/seconds": 640.0, "generate/new_samples": 6400, "generate/cached": 0.0})
    records[1]["metrics"].update({"generate/seconds": 0.1, "generate/new_samples": 6400, "generate/cached": 1.0})
    costs = analyze(records).axes["best/val_loss"].costs
    assert costs["generate_s_per_sample"] == pytest.approx(0.1)


def test_a_two_point_steps_axis_is_priced_at_the_doubling_it_measured():
    """A steps probe from 3,000 to 6,500 steps: the price is the 3,500 steps it added, per doubling."""
    records = [grid_record(6400, 3000, 10.0 + 0.01 * sd, seed=sd, converged=True) for sd in (0, 1)]
    records += [grid_record(n, 2000 + n // 8, 10.5 - 0.01 * k, seed=0, converged=True)
                for k, n in enumerate((800, 1600, 3200))]
    probes = [grid_record(6400, 6500, 9.5 + 0.01 * sd, seed=sd, converged=True) for sd in (0, 1)]
    for r in probes:
        r["params"]["train.extend_steps"] = "3000"
    for r in records + probes:
        r["metrics"]["train/seconds"] = 0.5 * r["metrics"]["train/steps"]
    steps = analyze(records + probes).axes["best/val_loss"].steps
    assert steps.name == "steps probe" and steps.x.tolist() == [3000.0, 6500.0]
    assert steps.seconds == pytest.approx(3500 * 0.5 / np.log2(6500 / 3000))

"""Known-answer tests of the sweep analysis: synthetic sweeps whose truth is known, and an MLflow round trip."""

from __future__ import annotations

import numpy as np
import pytest

from draftlab.analysis.core import analyze
from draftlab.analysis.fit import fit_power_law
from draftlab.analysis.records import label, parse_param

SAMPLES = (1000, 2000, 4000, 8000, 16000)
TOKENS_PER_SAMPLE = 2100.0


def record(samples, seed, val, train=None, tau=None, history=None, steps=500, converged=True, **params):
    """One job record as MLflow gives it back: params as strings, final metrics, optional histories.

    By default the run was trained to convergence (early stopping fired after `steps` steps)."""
    p = {"data.samples": samples, "train.seed": seed, "extract.layers": "auto", "draft.num_layers": 1,
         "train.max_steps": 4000, "train.early_stop_patience": 4, "tracking.experiment": "x", **params}
    m = {"extract/tokens": samples * TOKENS_PER_SAMPLE, "val/loss": val, "train/steps": steps,
         "train/stopped_early": float(converged)}
    if train is not None:
        m["train/loss"] = train
    if tau is not None:
        m["bench/tau"] = tau
    for j in range(3):
        m[f"val/acc_{j}"] = 0.7 * 0.9**j
    return {"params": {k: str(v) for k, v in p.items()}, "metrics": m, "history": history or {}}


def power(samples, inf, a, alpha):
    return inf + a * (samples / SAMPLES[0]) ** -alpha


def steep_sweep(rng, seeds=(0, 1), noise=0.02):
    return [record(s, sd, power(s, 5.0, 3.0, 0.5) + rng.normal(0, noise), train=power(s, 5.0, 3.0, 0.5) - 0.1,
                   tau=4.0 - 2.0 * (s / SAMPLES[0]) ** -0.4 + rng.normal(0, 0.03))
            for s in SAMPLES for sd in seeds]


def flat_sweep(rng, noise=0.005, **params):
    return [record(s, sd, 6.13 + rng.normal(0, noise), train=6.10 + rng.normal(0, noise), **params)
            for s in SAMPLES for sd in (0, 1)]


def test_params_parse_back_from_mlflow_strings():
    assert parse_param("800") == 800 and parse_param("1e-3") == 1e-3 and parse_param("None") is None
    assert parse_param("[1, 3, 4]") == [1, 3, 4] and parse_param("auto") == "auto"
    assert label([1, 3, 4]) == "[1,3,4]"


def test_fit_recovers_known_parameters():
    n = np.array(SAMPLES, dtype=float) * TOKENS_PER_SAMPLE
    groups = [(x, np.array([power(x / TOKENS_PER_SAMPLE, 5.0, 3.0, 0.5)])) for x in n]
    fit = fit_power_law("val/loss", groups, sign=1)
    assert fit.ok
    assert fit.params["y_inf"].value == pytest.approx(5.0, abs=1e-3)
    assert fit.params["alpha"].value == pytest.approx(0.5, abs=1e-3)
    assert fit.params["A_at_nmax"].value == pytest.approx(3.0 * 16**-0.5, rel=1e-3)
    true_gain = 3.0 * (16**-0.5 - 32**-0.5)
    assert fit.gain_per_doubling.value == pytest.approx(true_gain, rel=1e-3)
    assert fit.projections["2x"].value == pytest.approx(power(32000, 5.0, 3.0, 0.5), abs=1e-3)


def test_rising_tau_fit_has_positive_gain():
    groups = [(float(s), np.array([4.0 - 2.0 * (s / 1000) ** -0.4])) for s in SAMPLES]
    fit = fit_power_law("bench/tau", groups, sign=-1, lower=1.0)
    assert fit.params["y_inf"].value == pytest.approx(4.0, abs=1e-2)
    assert fit.gain_per_doubling.value == pytest.approx(2.0 * (16**-0.4 - 32**-0.4), rel=1e-2)


def test_steep_power_law_is_data_limited(tmp_path):
    rng = np.random.default_rng(0)
    result = analyze(steep_sweep(rng), tmp_path)
    assert result.verdict == "data-limited" and result.tag == "data-limited"
    gain = result.fits["val/loss"].gain_per_doubling
    true_gain = 3.0 * (16**-0.5 - 32**-0.5)
    assert gain.lo <= true_gain * 1.1 and gain.hi >= true_gain * 0.9
    assert result.fits["val/loss"].sigma_df > 0  # seeds and/or residuals give a noise estimate
    assert result.numbers["analysis/verdict_code"] == 1.0
    assert result.numbers["analysis/tau_gain_per_doubling"] > 0.1
    assert (tmp_path / "report.md").read_text().startswith("# Sweep analysis")
    for name in ("scaling_loss", "scaling_tau", "accuracy_by_step"):
        assert result.paths[name].exists()


def test_flat_curve_with_small_gap_is_a_capacity_bottleneck():
    result = analyze(flat_sweep(np.random.default_rng(1)))
    assert result.verdict == "bottleneck" and result.bottleneck == "capacity"
    assert result.details.data_state == "flat"


def test_pure_noise_is_undetermined():
    rng = np.random.default_rng(2)
    records = [record(s, 0, 6.0 + rng.normal(0, 0.3)) for s in SAMPLES]
    result = analyze(records)
    assert result.verdict == "undetermined", result.report
    assert result.next_steps


def test_two_points_are_undetermined():
    records = [record(s, sd, power(s, 5.0, 3.0, 0.5) + 0.01 * sd) for s in (1000, 2000) for sd in (0, 1)]
    result = analyze(records)
    assert result.verdict == "undetermined" and result.details.data_state == "insufficient"
    assert np.isfinite(result.fits["val/loss"].local_gain.value)


def test_layer_sweep_with_one_layer_much_worse_names_features(tmp_path):
    rng = np.random.default_rng(3)
    records = flat_sweep(rng)
    records += [record(16000, sd, 6.63 + rng.normal(0, 0.005), train=6.6, **{"extract.layers": "last"})
                for sd in (0, 1)]
    records += [record(16000, sd, 6.20 + rng.normal(0, 0.005), train=6.2, **{"extract.layers": "[2, 5]"})
                for sd in (0, 1)]
    result = analyze(records, tmp_path)
    assert result.verdict == "bottleneck" and result.bottleneck == "features", result.report
    (layers,) = [c for c in result.comparisons if c.key == "extract.layers"]
    assert layers.best == "auto" and layers.worst == "last" and layers.baseline == "auto"
    assert layers.best_vs_worst.value == pytest.approx(0.5, abs=0.03) and layers.best_vs_worst.lo > 0.4
    assert result.paths["compare_extract_layers"].exists()


def test_layer_by_data_grid_fits_each_series():
    rng = np.random.default_rng(10)
    records = steep_sweep(rng) + [record(s, sd, 6.6 + rng.normal(0, 0.01), **{"extract.layers": "last"})
                                  for s in SAMPLES for sd in (0, 1)]
    result = analyze(records)
    assert result.verdict == "data-limited"  # the first-seen config (auto) is the baseline; it scales
    assert "extract.layers=last" in result.report and "Other configs swept over data" in result.report


def test_bigger_draft_at_fixed_data_names_capacity():
    rng = np.random.default_rng(4)
    records = flat_sweep(rng)
    records += [record(16000, sd, 5.8 + rng.normal(0, 0.005), **{"draft.num_layers": 2}) for sd in (0, 1)]
    result = analyze(records)
    assert result.bottleneck == "capacity" and result.details.findings[0].direct
    assert "serve draft.num_layers=2 with the bench stage" in result.details.findings[0].text


def test_steep_curve_at_one_step_budget_is_not_data_limited():
    """Runs that hit their step budget (no early stopping) and no steps axis: the data gain may be steps."""
    rng = np.random.default_rng(5)
    records = [record(s, sd, power(s, 5.0, 3.0, 0.5) + rng.normal(0, 0.01), converged=False)
               for s in SAMPLES for sd in (0, 1)]
    result = analyze(records)
    assert result.verdict == "undetermined", result.report
    assert "not at convergence" in " ".join(result.report.split())  # the report wraps its lines


def test_bootstrap_is_deterministic_for_a_seed():
    records = steep_sweep(np.random.default_rng(6))
    a, b = analyze(records, seed=7), analyze(records, seed=7)
    assert a.numbers == b.numbers and a.report == b.report
    c = analyze(records, seed=8)
    assert c.numbers["analysis/loss_gain_per_doubling_lo"] != a.numbers["analysis/loss_gain_per_doubling_lo"]


def test_nothing_to_analyse_is_undetermined_not_an_error():
    assert analyze([]).verdict == "undetermined"
    no_loss = [{"params": {"data.samples": "10"}, "metrics": {"generate/tokens": 5.0}}]
    assert analyze(no_loss).verdict == "undetermined"


@pytest.mark.slow  # MLflow builds its SQLite schema (~10 s); the rest of the test is quick
def test_mlflow_round_trip_and_cli_logs_to_parent(tmp_path, capsys):
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from draftlab.tracking.analyze import main
    from draftlab.tracking.mlflow_source import load_records

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("sweeps", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp, run_name="sweep").info.run_id
    for i, rec in enumerate(steep_sweep(np.random.default_rng(9))):
        child = client.create_run(exp, tags={"mlflow.parentRunId": parent}).info.run_id
        history = [Metric("val/loss", rec["metrics"]["val/loss"] * (1 + 0.2 * (3 - e) / 3), 0, e)
                   for e in range(4)]
        client.log_batch(child, params=[Param(k, v) for k, v in rec["params"].items()],
                         metrics=history + [Metric(k, v, 0, 3) for k, v in rec["metrics"].items()
                                            if k != "val/loss"])
        client.set_terminated(child, "FAILED" if i == 0 else "FINISHED")
    sweep = load_records("sweeps", uri)  # by experiment name: the latest parent
    assert sweep.parent_run_id == parent and len(sweep.records) == 9 and len(sweep.skipped) == 1
    assert [s for s, _ in sweep.records[0]["history"]["val/loss"]] == [0, 1, 2, 3]
    assert sweep.records[0]["params"]["data.samples"] in {str(s) for s in SAMPLES}

    assert main([parent, "--tracking-uri", uri, "--out", str(tmp_path / "out"), "--log-to-parent",
                 "--boot", "200"]) == 0
    out = capsys.readouterr().out
    assert "Verdict: data-limited" in out
    run = client.get_run(parent)
    assert run.data.tags["verdict"] == "data-limited"
    answer = run.data.tags["verdict.answer"]
    assert answer.startswith("**Answer in deployed tau") and answer in out  # the same text in both places
    assert run.data.metrics["analysis/verdict_code"] == 1.0 and "analysis/loss_gain_per_doubling" in run.data.metrics
    logged = {a.path for a in client.list_artifacts(parent, "analysis")}
    assert {"analysis/report.md", "analysis/answer.md", "analysis/scaling_loss.png",
            "analysis/scaling_tau.png"} <= logged

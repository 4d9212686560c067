"""Known-answer tests of the verdict in the user's currency: tau decides, levers are compared at equal cost, the
joint lever, ceilings the families disagree on, and model-free local gains.

Each synthetic sweep plants its truth in tau (and a loss that follows it at 0.3 tau a unit unless the test says
otherwise); records are built in the shape of `draftlab.analysis.records`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from draftlab.analysis.core import analyze
from draftlab.analysis.families import NO_CEILING, FamilyFit, ceiling
from draftlab.analysis.stats import Estimate

SIZES = [1600 * 2**k for k in range(5)]  # 1,600 .. 25,600 samples
RATE = 0.3  # tau per unit of loss


def rec(n, seed, tau, steps=3000, loss=None, probe=0, **params):
    """A converged run (early stopping fired) at `steps`; a steps probe when `probe` > 0."""
    p = {"data.samples": n, "train.seed": seed, "extract.layers": "auto", "draft.num_layers": 1,
         "train.max_steps": 20000, "train.early_stop_patience": 4, "train.extend_steps": probe, **params}
    loss = 10.0 - tau / RATE if loss is None else loss
    m = {"train/train_tokens": n * 150.0, "val/loss": loss, "train/loss": loss - 0.05, "val/predicted_tau": tau,
         "train/steps": steps, "train/stopped_early": 1.0}
    return {"run_id": f"n{n}s{seed}p{probe}" + "".join(f"-{v}" for v in params.values()), "metrics": m,
            "params": {k: str(v) for k, v in p.items()}}


def tau_at(n, steps=3000, a=0.8, per_steps_doubling=0.06):
    """The planted truth: a power law in data (gain per doubling 0.059 at 25,600) plus a gain per doubling of
    steps."""
    return 3.0 - a * (n / 1600) ** -0.5 + per_steps_doubling * math.log2(steps / 3000)


def sweep(per_steps_doubling=0.06, noise=0.003, rng_seed=0):
    """Five sizes trained to convergence at 3,000 steps, two seeds each, and steps probes at the two largest
    sizes that reach 6,000 steps."""
    rng = np.random.default_rng(rng_seed)
    out = [rec(n, seed, tau_at(n) + rng.normal(0, noise)) for n in SIZES for seed in (0, 1)]
    out += [rec(n, seed, tau_at(n, 6000, per_steps_doubling=per_steps_doubling) + rng.normal(0, noise), steps=6000,
                probe=2500) for n in SIZES[3:] for seed in (0, 1)]
    return out


def test_loss_improving_with_steps_while_tau_is_flat_is_not_under_trained():
    """The probe gains 1.0 in loss (above the loss line of 0.33 at this rate) and nothing in tau."""
    records = sweep(per_steps_doubling=0.0)
    for r in records:
        if r["params"]["train.extend_steps"] != "0":
            r["metrics"]["val/loss"] -= 1.0
    result = analyze(records, n_boot=300)
    assert result.tag != "under-trained", result.report
    assert result.details.metric == "val/predicted_tau" and result.details.steps_state == "flat"
    assert result.axes["val/loss"].steps.gain.value == pytest.approx(1.0, abs=0.01)  # the loss did move


def test_the_joint_lever_is_the_only_one_that_clears_the_line():
    """Steps alone 0.06 a doubling, data alone 0.059 next and 0.083 last: together, 0.083 + 0.06 = 0.143."""
    result = analyze(sweep(), n_boot=300)
    assert result.tag == "joint", result.report
    joint = result.joints["val/predicted_tau"]
    assert joint.gain.value == pytest.approx(0.8 * (8**-0.5 - 16**-0.5) + 0.06, abs=0.015) and joint.gain.lo > 0.1
    assert "the only lever that clears the line" in " ".join(result.answer.split())
    assert {lv.name: lv.state for lv in result.levers}["joint"] == "limited"
    assert result.details.steps_state == "flat"


def capacity_sweep(per_steps_doubling):
    """The baseline and a two-layer draft at the largest size; the two-layer runs trained 4x the steps, and gain
    exactly what those steps give the baseline: nothing of their own."""
    out = sweep(per_steps_doubling)
    out += [rec(SIZES[-1], seed, tau_at(SIZES[-1], 12000, per_steps_doubling=per_steps_doubling), steps=12000,
                **{"draft.num_layers": 2}) for seed in (0, 1)]
    return out


def test_a_capacity_gain_that_vanishes_at_equal_steps_is_no_finding():
    result = analyze(capacity_sweep(0.06), n_boot=300)
    assert not any(f.category == "capacity" and f.direct for f in result.details.findings), result.report
    (x,) = [x for x in result.contrasts if x.comparison.key == "draft.num_layers"
            and x.comparison.metric == "val/predicted_tau"]
    assert x.as_trained.value == pytest.approx(0.12, abs=0.01) and x.as_trained.lo > 0.1  # resolved as trained
    assert x.equal_steps.value == pytest.approx(0.0, abs=0.01) and x.basis == "equal steps"


def test_an_unconverged_baseline_leaves_the_ablation_unresolved():
    """The probe still gains 0.2 tau a doubling: the baseline is not converged, so no capacity finding."""
    result = analyze(capacity_sweep(0.2), n_boot=300)
    assert result.tag == "under-trained", result.report
    assert not any(f.category == "capacity" for f in result.details.findings), result.report
    assert any("draft.num_layers" in u and "not converged" in u for u in result.details.unresolved)


def test_families_whose_ceilings_differ_by_more_than_the_line_give_no_ceiling():
    """The committed sweep's shape: intervals that overlap, points 0.30 tau apart."""
    n = np.array(SIZES + [51200], dtype=float)
    fams = [FamilyFit("power law", Estimate(0.08), Estimate(3.1), Estimate(3.33, 3.07, 3.98)),
            FamilyFit("log-quadratic", Estimate(0.0), Estimate(3.0), Estimate(3.03, 2.94, 3.64))]
    assert ceiling(n, fams)[0] is not None  # overlapping intervals alone let it through
    found, why = ceiling(n, fams, material=0.1)
    assert found is None and why.startswith(NO_CEILING) and "apart" in why
    found, why = ceiling(n, fams[:1] + [FamilyFit("log-quadratic", Estimate(0.0), Estimate(3.0),
                                                  Estimate(3.3, 2.94, 3.64))], material=0.1, misfit=9.0)
    assert found is None and "seed-to-seed noise" in why


def test_the_local_gain_interval_is_model_free():
    """Means that zigzag off any smooth curve (misfit 0.05) with seeds 0.002 apart: the two largest sizes' gain
    has the seeds' interval, not the misfit's."""
    zig = [0.05, -0.05, 0.05, -0.05, 0.05, -0.05]
    records = [rec(n, seed, tau_at(n) + z + 0.002 * seed) for n, z in zip(SIZES + [51200], zig) for seed in (0, 1)]
    fit = analyze(records, n_boot=300).fits["val/predicted_tau"]
    assert fit.sigma > 0.02  # the fit's noise is its misfit
    local = fit.local_gain
    assert local.hi - local.lo < 0.02 and local.lo <= local.value <= local.hi


def test_the_report_says_whether_deployed_tau_peaked_before_the_loss():
    records = sweep()
    watched = [r for r in records if r["params"]["data.samples"] == str(SIZES[-1])
               and r["params"]["train.extend_steps"] == "0"]
    for r, first, after in zip(watched, (1.0, 0.0), (-0.049, 0.0)):
        r["metrics"].update({"train/tau_peaked_first": first, "train/bench_tau_after_peak": after,
                             "train/bench_tau_peak": 2.9, "train/bench_tau_peak_step": 2000.0,
                             "train/val_loss_min_step": 3000.0 if first else 1500.0})
    result = analyze(records, n_boot=100)
    said = " ".join(result.answer.split())
    assert "peaked before the val/loss minimum in 1 of 2 runs" in said and "4.9%" in said
    assert "## Deployed tau during training" in result.report

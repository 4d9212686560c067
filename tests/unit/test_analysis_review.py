"""Known-answer tests of the rules a careful reader checks: validation-sample noise in the intervals, the slope
left at a plateau, steps probes, curve families and ceilings, one code version, and the generated report.

Records are built by hand in the shape of `draftlab.analysis.records`; each sweep's truth is set by construction.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from draftlab.tracking.analyze import main
from draftlab.analysis.core import analyze
from draftlab.analysis.fit import fit_power_law
from draftlab.analysis.families import NO_CEILING
from draftlab.analysis.records import normalise
from draftlab.analysis.valnoise import val_noise

WIDE = [1600 * 2**k for k in range(7)]  # 1,600 .. 102,400 samples


def rec(n, seed, loss, tau, steps=3000, val=None, slope=None, tags=None, **params):
    """A converged run (early stopping fired) with predicted tau; optional per-sample results and final slope."""
    p = {"data.samples": n, "train.seed": seed, "extract.layers": "auto", "draft.num_layers": 1,
         "train.max_steps": 20000, "train.early_stop_patience": 4, **params}
    m = {"train/train_tokens": n * 148.0, "val/loss": loss, "train/loss": loss - 0.05, "val/predicted_tau": tau,
         "train/steps": steps, "train/stopped_early": 1.0}
    if slope is not None:
        m.update({"train/final_slope": slope[0], "train/final_slope_lo": slope[1], "train/final_slope_hi": slope[2]})
    out = {"run_id": f"n{n}s{seed}" + "".join(f"-{v}" for v in params.values()), "metrics": m,
           "params": {k: str(v) for k, v in p.items()}, "tags": tags or {}}
    if val is not None:
        out["val_samples"] = val
    return out


def per_sample(k, loss, tau, diff_loss, diff_tau):
    """The first k samples of a nested validation split: each sample's own difficulty around the run's mean."""
    return {"index": list(range(k)), "loss": (loss + diff_loss[:k] - diff_loss[:k].mean()).tolist(),
            "tau": (tau + diff_tau[:k] - diff_tau[:k].mean()).tolist(), "tokens": [60.0] * k}


def plateau_sweep(samples=True, slope=True):
    """The 102,400-like case: data gains just under material (tau ~0.08 a doubling, seed sd 0.007), a small
    train/val gap, each size scored on its own nested 12.5% split, and early stopping firing while val/loss still
    fell (0.15 per 1000 steps after 3,000 steps)."""
    rng = np.random.default_rng(0)
    diff_loss, diff_tau = rng.normal(0, 3.0, 20000), rng.normal(0, 0.8, 20000)
    out = []
    for n in WIDE:
        for seed in (0, 1):
            loss = 7.0 + 1.5 * (n / 1600) ** -0.5 + rng.normal(0, 0.01)
            tau = 3.6 - 2.18 * (n / 1600) ** -0.5 + rng.normal(0, 0.007)
            val = per_sample(n // 8, loss, tau, diff_loss, diff_tau) if samples else None
            out.append(rec(n, seed, loss, tau, val=val, slope=(-0.15, -0.22, -0.08) if slope else None))
    return out


def test_plateau_at_the_noise_floor_is_not_a_capacity_bottleneck():
    result = analyze(plateau_sweep(), n_boot=300)
    assert result.tag != "bottleneck:capacity", result.report
    assert "validation-sample noise is in the intervals" in result.report
    assert any("still falling when early stopping fired" in e for e in result.evidence)
    assert any("train.extend_steps" in s for s in result.next_steps)


def test_the_slope_alone_keeps_the_plateau_off_capacity():
    assert analyze(plateau_sweep(samples=False, slope=True), n_boot=300).tag != "bottleneck:capacity"


def test_decided_on_tau_the_planted_data_gain_is_below_the_line_with_validation_noise_too():
    """The planted tau gain is 0.08 a doubling: below the 0.1 line, and validation-sample noise (wide in loss)
    leaves the tau interval below it too; so in tau the samples are no safeguard of their own, the slope is."""
    result = analyze(plateau_sweep(samples=True, slope=False), n_boot=300)
    assert result.details.metric == "val/predicted_tau" and result.details.data_state == "flat", result.report
    assert result.axes["val/predicted_tau"].data.gain.hi < 0.1


def test_the_same_plateau_read_the_old_way_is_the_trap():
    """Seed noise alone and no slope: the rules of old call it capacity, so the tests above test something."""
    assert analyze(plateau_sweep(samples=False, slope=False), n_boot=300).tag == "bottleneck:capacity"


def test_validation_noise_widens_the_intervals():
    with_noise = analyze(plateau_sweep(slope=False), n_boot=300).fits["val/loss"].gain_per_doubling
    without = analyze(plateau_sweep(samples=False, slope=False), n_boot=300).fits["val/loss"].gain_per_doubling
    assert with_noise.hi - with_noise.lo > 3 * (without.hi - without.lo)


def test_a_shared_validation_set_pairs_the_runs():
    """Runs scored on the same samples move together under the bootstrap: a constant difference stays exact."""
    rng = np.random.default_rng(1)
    values = rng.normal(8.0, 3.0, 500)
    shared = [rec(1600, 0, 8.0, 2.0, val={"index": list(range(500)), "loss": values.tolist(), "tau": [2.0] * 500}),
              rec(3200, 0, 7.5, 2.0, val={"index": list(range(500)), "loss": (values - 0.5).tolist(),
                                          "tau": [2.0] * 500})]
    runs, _ = normalise(shared)
    vn = val_noise(runs, "val/loss", 200, 0)
    assert vn.shared and vn.known and np.std(vn.shifts["n1600s0"]) > 0.05
    np.testing.assert_allclose(vn.shifts["n1600s0"], vn.shifts["n3200s0"], atol=1e-12)
    assert vn.differing == 0 and vn.sets == 1 and "paired bootstrap over the 500" in vn.describe()
    shared[0]["val_samples"]["tokens"] = [60.0] * 500
    shared[1]["val_samples"]["tokens"] = [60.0] * 497 + [59.0] * 3  # three answers generated again, shorter
    vn = val_noise(normalise(shared)[0], "val/loss", 200, 0)  # other answers: two sets, bootstrapped apart
    assert vn.differing == 3 and vn.sets == 2 and "2 validation sets" in vn.describe()
    assert np.std(vn.shifts["n1600s0"] - vn.shifts["n3200s0"]) > 0.05
    shared[1]["val_samples"]["index"] = list(range(500, 1000))  # each size its own split: no longer paired
    vn = val_noise(normalise(shared)[0], "val/loss", 200, 0)
    assert not vn.shared and np.std(vn.shifts["n1600s0"] - vn.shifts["n3200s0"]) > 0.05


def test_runs_on_one_set_stay_paired_beside_a_set_generated_again():
    """Two machines' pools: equal lengths within each, other lengths between; a run scored on a subset of one set
    joins that set."""
    rng = np.random.default_rng(2)
    values, first, again = rng.normal(8.0, 3.0, 400), [60.0] * 400, [70.0] * 10 + [60.0] * 390

    def run(n, seed, tokens, k=400):
        return rec(n, seed, 8.0, 2.0, val={"index": list(range(k)), "loss": values[:k].tolist(), "tau": [2.0] * k,
                                           "tokens": tokens[:k]})

    vn = val_noise(normalise([run(1600, 0, first), run(1600, 1, first), run(3200, 0, again),
                              run(3200, 1, again, k=300)])[0], "val/loss", 300, 0)
    assert vn.sets == 2 and vn.differing == 10 and not vn.shared
    np.testing.assert_allclose(vn.shifts["n1600s0"], vn.shifts["n1600s1"], atol=1e-12)
    assert np.std(vn.shifts["n1600s0"] - vn.shifts["n3200s0"]) > 0.05
    assert np.corrcoef(vn.shifts["n3200s0"], vn.shifts["n3200s1"])[0, 1] > 0.6  # 300 of its 400 samples shared


def test_two_sizes_at_convergence_ask_for_a_third():
    """Two converged sizes give the last doubling's gain but no curve: undetermined, and the next step says how
    many sizes a curve needs."""
    result = analyze([rec(n, seed, 9.0 - 0.2 * k + 0.01 * seed, 2.0) for k, n in enumerate(WIDE[4:6])
                      for seed in (0, 1)], n_boot=200)
    assert result.tag == "undetermined" and "too few sizes" in result.headline, result.report
    assert any("run at least 3 data sizes" in s for s in result.next_steps)


def tau_of(loss):
    """Predicted tau that moves with the loss: 0.3 tau per unit of loss, the size of SmolLM2's sweep's rate."""
    return 5.0 - 0.3 * loss


def probe_sweep(probe_gain, tau=tau_of):
    """Five sizes trained to convergence, and steps probes (train.extend_steps=3000) at the two largest; tau
    follows the loss through `tau`."""
    def loss(n, seed, gain=0.0):
        return 7.0 + 6.0 * (n / 1600) ** -0.5 + 0.01 * seed - gain

    out = [rec(n, seed, loss(n, seed), tau(loss(n, seed))) for n in WIDE[:5] for seed in (0, 1)]
    out += [rec(n, seed, loss(n, seed, probe_gain), tau(loss(n, seed, probe_gain)), steps=6500,
                **{"train.extend_steps": 3000}) for n in WIDE[3:5] for seed in (0, 1)]
    return out


def test_early_stopping_with_a_positive_steps_probe_is_under_trained():
    """The probe gains 0.6 in loss and, at 0.3 tau a unit, 0.18 tau: under-trained in the user's currency."""
    result = analyze(probe_sweep(probe_gain=0.6), n_boot=300)
    assert result.tag == "under-trained", result.report
    steps = result.axes["val/loss"].steps
    assert steps.name == "steps probe" and steps.x.tolist() == [3000.0, 6500.0]
    assert steps.gain.value == pytest.approx(0.6 / np.log2(6500 / 3000), rel=1e-6)
    tau = result.axes["val/predicted_tau"].steps
    assert tau.gain.value == pytest.approx(0.3 * 0.6 / np.log2(6500 / 3000), rel=1e-6)


def test_a_flat_steps_probe_leaves_the_data_verdict():
    result = analyze(probe_sweep(probe_gain=0.0), n_boot=300)
    assert result.tag == "data-limited", result.report
    assert result.axes["val/loss"].data.x.size == 5  # the probes are not points of the converged data axis


def test_two_families_that_disagree_give_no_ceiling():
    fit = analyze(plateau_sweep(slope=False), n_boot=300).fits["val/predicted_tau"]
    assert len(fit.n) == 7 and fit.ceiling is None
    assert fit.ceiling_note.startswith(NO_CEILING) and "disagree" in fit.ceiling_note


def test_a_ceiling_needs_five_sizes_spanning_16x_and_agreeing_families():
    rng = np.random.default_rng(1)

    def fit(sizes):
        groups = [(float(n), 3.5 - 2.0 * (n / 1600) ** -1.0 + rng.normal(0, 0.01, 2)) for n in sizes]
        return fit_power_law("val/predicted_tau", groups, sign=-1, lower=1.0, seed_sigma=0.01, seed_df=6)

    saturating = fit(WIDE[:6])  # flat well inside the data: both families find the same top
    assert saturating.ceiling is not None and saturating.ceiling.lo <= 3.5 <= saturating.ceiling.hi
    four = fit(WIDE[:4])  # SmolLM2's first sweep: four sizes spanning 8x
    assert four.ceiling is None and "4 sizes" in four.ceiling_note and four.ceiling_note.startswith(NO_CEILING)
    assert set(four.projections) == {"2x"}  # nothing projected past twice the largest size


def steep(tags_of=lambda n, seed: {}):
    return [rec(n, seed, loss, tau_of(loss), tags=tags_of(n, seed))
            for n in WIDE[:5] for seed in (0, 1) for loss in [7.0 + 6.0 * (n / 1600) ** -0.5 + 0.01 * seed]]


def test_runs_on_mixed_code_are_flagged_and_not_resolved():
    def tags(n, seed):
        return {"code.train": "b" * 16 if n == WIDE[4] and seed == 1 else "a" * 16, "code.extract": "e" * 16}

    result = analyze(steep(tags), n_boot=200)
    assert result.tag == "undetermined" and result.numbers["analysis/mixed_code"] == 1.0, result.report
    assert "2 code versions" in result.headline and "n25600s1" in result.mixed_code
    assert "n1600s0" not in result.mixed_code.split("bbbb")[1]  # the odd run is named on its own version
    allowed = analyze(steep(tags), n_boot=200, allow_mixed_code=True)
    assert allowed.tag == "data-limited" and "--allow-mixed-code" in allowed.evidence[0]
    assert analyze(steep(lambda n, s: {"code.train": "a" * 16}), n_boot=200).tag == "data-limited"


def test_a_comparison_across_code_versions_is_not_a_finding():
    base = {"code.train": "a" * 16, "code.extract": "e" * 16}
    last = rec(WIDE[4], 0, 7.0 + 6.0 * 16 ** -0.5 + 1.0, 1.7, tags={**base, "code.train": "b" * 16},
               **{"extract.layers": "last"})
    mixed = analyze(steep(lambda n, s: base) + [last], n_boot=200)
    assert mixed.tag == "undetermined" and not mixed.details.findings, mixed.report
    assert any("not called resolved: mixed code" in e and "extract.layers" in e for e in mixed.evidence)
    allowed = analyze(steep(lambda n, s: base) + [last], n_boot=200, allow_mixed_code=True)
    assert [f.category for f in allowed.details.findings] == ["features"], allowed.report  # tau's alone


def test_a_commit_recorded_as_unknown_says_nothing_about_code():
    def tags(n, seed):  # a tree without git records its stages' commit as 'unknown'
        return {"train/produced_by": "unknown" if n < WIDE[4] else "c1", "extract/produced_by": "unknown"}

    assert analyze(steep(tags), n_boot=200).tag == "data-limited"


def test_records_from_before_code_tags_compare_their_producing_commits():
    def tags(n, seed):
        return {"train/produced_by": "c1" if n < WIDE[4] else "c2", "extract/produced_by": "c1"}

    result = analyze(steep(tags), n_boot=200)
    assert result.tag == "undetermined" and "train c2" in result.mixed_code


def test_the_report_is_generated_from_records(tmp_path, capsys):
    records = tmp_path / "records.jsonl"
    records.write_text("\n".join(json.dumps(r) for r in plateau_sweep()))
    report = tmp_path / "docs" / "scaling.md"
    report.parent.mkdir()
    assert main(["scaling", "--records", str(records), "--report", str(report), "--boot", "100"]) == 0
    text = report.read_text()
    assert text.startswith("# Sweep analysis") and "Generated by `python src/analyze.py scaling --records" in text
    assert "](scaling_figures/scaling_loss.png)" in text
    assert (tmp_path / "docs" / "scaling_figures" / "scaling_loss.png").exists()
    assert "spread between families" in text and NO_CEILING in text
    assert "| N | samples | runs |" in text and f"| {WIDE[-1] * 148.0:.4g} | {WIDE[-1]} | 2 |" in text
    assert "Verdict:" in capsys.readouterr().out


def test_the_report_lists_only_the_settings_of_the_stages_that_ran():
    """A sweep of generate, extract and train: bench's settings, logged with every job, are not its baseline."""
    tags = {"code.generate": "g", "code.extract": "e", "code.train": "t"}
    records = [rec(n, s, 9.0 - 0.1 * k + 0.01 * s, 2.0, tags=tags, **{"bench.prompts": 80, "train.lr": 0.001})
               for k, n in enumerate(WIDE[:3]) for s in (0, 1)]
    text = " ".join(analyze(records, n_boot=100).report.split())  # the report wraps its lines
    assert "the settings read by the stages that ran: extract, generate, train" in text
    assert "train.lr=0.001" in text and "extract.layers=auto" in text and "bench.prompts" not in text


def test_comparisons_at_equal_data_include_validation_noise():
    """A layer ablation scored on its own validation samples: the difference's interval widens by their noise."""
    rng = np.random.default_rng(2)
    diffs = rng.normal(0, 3.0, 400)

    def ablation(samples):
        out = []
        for layers, loss in (("auto", 8.0), ("last", 8.2)):
            for seed in (0, 1):
                value = loss + 0.005 * seed
                val = {"index": list(range(400) if layers == "auto" else range(400, 800)),
                       "loss": (value + diffs - diffs.mean()).tolist(), "tau": [2.0] * 400} if samples else None
                out.append(rec(25600, seed, value, 2.0, val=val, **{"extract.layers": layers}))
        return out + [rec(n, 0, 9.0 - 0.1 * i, 2.0) for i, n in enumerate(WIDE[:3])]

    def interval(samples):
        (c,) = [c for c in analyze(ablation(samples), n_boot=300).comparisons
                if c.key == "extract.layers" and c.metric == "val/loss"]
        return c.best_vs_worst

    plain, noisy = interval(False), interval(True)
    assert plain.value == pytest.approx(noisy.value) and noisy.hi - noisy.lo > 2 * (plain.hi - plain.lo)
    # the baseline (auto) is best: against itself it is 0 exactly, and the report says so
    result = analyze(ablation(True), n_boot=300)
    (c,) = [c for c in result.comparisons if c.key == "extract.layers" and c.metric == "val/loss"]
    assert c.best == c.baseline == "auto"
    assert (c.best_vs_baseline.value, c.best_vs_baseline.lo, c.best_vs_baseline.hi) == (0.0, 0.0, 0.0)
    assert "| extract.layers | auto over last |" in result.report


def test_steps_probes_stay_out_of_comparisons_at_equal_data():
    """A probe trained past its plateau is not the baseline's recipe: a draft.num_layers ablation is compared
    with the baseline's converged runs alone."""
    records = probe_sweep(probe_gain=0.6) + [rec(WIDE[4], seed, 7.0 + 6.0 * 16**-0.5 - 0.3, 2.0,
                                                 **{"draft.num_layers": 2}) for seed in (0, 1)]
    (c,) = [c for c in analyze(records, n_boot=200).comparisons
            if c.key == "draft.num_layers" and c.metric == "val/loss"]
    base = next(lv for lv in c.levels if lv.baseline)
    assert base.count == 2 and c.best_vs_baseline.value == pytest.approx(0.3 + 0.005, abs=1e-9)


def test_a_flat_steps_probe_outranks_the_slope_left_at_the_plateau():
    """Measured beats extrapolated: probes at the two largest sizes that gain nothing show the steps are spent."""
    records = plateau_sweep(samples=False, slope=True)
    for r in [r for r in records if r["params"]["data.samples"] in (str(WIDE[5]), str(WIDE[6]))]:
        probe = json.loads(json.dumps(r))
        probe["run_id"] += "-probe"
        probe["params"]["train.extend_steps"] = "3000"
        probe["metrics"]["train/steps"] = 6500
        records.append(probe)
    result = analyze(records, n_boot=300)
    assert result.axes["val/loss"].steps.name == "steps probe" and result.details.steps_state == "flat"
    assert result.tag == "bottleneck:capacity", result.report


def test_a_job_without_a_train_stage_is_left_out_by_name():
    """A generate-only job of the sweep has no loss to weigh: left out and named, N still counted in tokens."""
    records = plateau_sweep(samples=False)
    generate_only = {"run_id": "generate-only", "params": {"data.samples": "102400", "stages": "[generate]"},
                     "metrics": {"generate/samples": 103400.0}}
    with_it, without = analyze(records + [generate_only], n_boot=100), analyze(records, n_boot=100)
    assert "1 record(s) without a validation loss left out: generate-only" in with_it.report
    assert "N from `metrics:train/train_tokens`" in with_it.report
    assert with_it.numbers == without.numbers

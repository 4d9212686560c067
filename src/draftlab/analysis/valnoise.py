"""Validation-sample noise: a paired bootstrap over the validation samples the runs were scored on.

A run's validation metric is a token-weighted mean over its validation samples, so the samples drawn into the
validation set are a noise source of their own, one that replicate seeds (scored on the same samples) never
show. Each bootstrap replicate reweights every sample of the sweep's validation set with a Poisson(1) count (the
Poisson bootstrap: one independent count per sample, so runs that share samples share their counts: paired),
and gives each run the shift of its weighted mean from its full-set mean. Fits and gains add these shifts to
their seed-noise draws, so their intervals hold both sources.

Records without per-sample results (older runs) contribute no shift: the report then says that its intervals
leave validation-sample noise out. A sample scored on other token counts in other runs is counted and warned of:
one index then holds other answers (or other scoring), which pairing by index cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from draftlab.analysis.records import LOSS_KEYS, Run

# which per-sample column scores which metric; other metrics (bench/tau) are measured on other prompts
COLUMN = {**{k: "loss" for k in LOSS_KEYS}, "val/predicted_tau": "tau"}


@dataclass
class ValNoise:
    metric: str
    shifts: dict[str, np.ndarray] = field(default_factory=dict)  # run_id -> [n_boot] shift of its metric
    samples: int = 0  # validation samples in the union of the runs' sets
    shared: bool = False  # every run was scored on the same samples
    missing: list[str] = field(default_factory=list)  # run ids without per-sample results
    # samples scored on other token counts in other runs: one index, but other answers (a pool generated again on
    # other code or settings) or other scoring, so "the same samples" is not the same set
    differing: int = 0

    @property
    def known(self) -> bool:
        return bool(self.shifts) and not self.missing

    def group_shift(self, runs: list[Run], n_boot: int) -> np.ndarray:
        """[n_boot] shift of the mean over `runs` (zeros where a run has none)."""
        rows = [self.shifts.get(r.run_id, np.zeros(n_boot))[:n_boot] for r in runs]
        return np.mean(rows, axis=0) if rows else np.zeros(n_boot)

    def describe(self) -> str:
        if not self.shifts:
            return ("validation-sample noise is NOT in the intervals: the records hold no per-sample validation "
                    "results")
        what = (f"a paired bootstrap over the {self.samples} validation samples every run shares" if self.shared
                else f"a bootstrap over {self.samples} validation samples, which the runs do not all share "
                     "(each size scored on its own split: unpaired where they differ)")
        gap = f"; {len(self.missing)} run(s) without per-sample results add none" if self.missing else ""
        if self.differing:
            gap += (f"; WARNING: {self.differing} validation sample(s) were scored on other token counts in other "
                    "runs: the sets differ in content (answers generated again) or in what is scored")
        return f"validation-sample noise is in the intervals: {what}{gap}"


def val_noise(runs: list[Run], metric: str, n_boot: int, seed: int) -> ValNoise:
    """Per-run bootstrap shifts of `metric` from the runs' per-sample validation results."""
    column = COLUMN.get(metric)
    out = ValNoise(metric)
    have = [r for r in runs if column and column in r.val_samples]
    out.missing = [r.run_id for r in runs if r not in have]
    if not have or n_boot <= 0:
        return out
    universe = np.unique(np.concatenate([r.val_samples["index"] for r in have]))
    out.samples = int(universe.size)
    out.shared = all(np.array_equal(np.unique(r.val_samples["index"]), universe) for r in have)
    positions = [np.searchsorted(universe, r.val_samples["index"]) for r in have]
    lengths = np.full((len(have), universe.size), np.nan)
    for row, r, pos in zip(lengths, have, positions):
        row[pos] = r.val_samples["tokens"]
    out.differing = int((np.nanmax(lengths, axis=0) != np.nanmin(lengths, axis=0)).sum())
    counts = np.random.default_rng(seed).poisson(1.0, size=(n_boot, universe.size)).astype(float)
    for r, pos in zip(have, positions):
        w, v = r.val_samples["tokens"], r.val_samples[column]
        full = float((w * v).sum() / w.sum())
        cw = counts[:, pos] * w[None, :]
        out.shifts[r.run_id] = (cw @ v) / np.maximum(cw.sum(axis=1), 1e-300) - full
    return out

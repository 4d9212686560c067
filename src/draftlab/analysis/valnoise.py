"""Validation-sample noise: a paired bootstrap over the validation samples the runs were scored on.

A run's validation metric is a token-weighted mean over its validation samples, so the samples drawn into the
validation set are a noise source of their own, one that replicate seeds (scored on the same samples) never
show. Each bootstrap replicate reweights every sample of the sweep's validation set with a Poisson(1) count (the
Poisson bootstrap: one independent count per sample, so runs that share samples share their counts: paired),
and gives each run the shift of its weighted mean from its full-set mean. Fits and gains add these shifts to
their seed-noise draws, so their intervals hold both sources.

Records without per-sample results (older runs) contribute no shift: the report then says that its intervals
leave validation-sample noise out. Runs are paired only within one validation set: runs whose samples agree in
token count wherever they share an index. A sample scored on other token counts elsewhere holds other answers
(a pool generated again: docs/tracking.md), and answers cut at data.max_new_tokens hide most such differences,
so two sets that differ anywhere are bootstrapped independently: wider intervals between them, never a pairing
of other answers.
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
    sets: int = 0  # validation sets: runs on one set are paired, sets are bootstrapped independently
    missing: list[str] = field(default_factory=list)  # run ids without per-sample results
    # indices scored on other token counts in other runs: other answers (a pool generated again) or other scoring
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
        if self.sets > 1 and self.differing:
            what = (f"a bootstrap over the validation samples, paired within each of the {self.sets} validation sets "
                    f"the runs were scored on and independent between them ({self.differing} of {self.samples} "
                    "indices hold answers of other lengths in other sets: answers generated again or scored otherwise)")
        elif self.shared:
            what = f"a paired bootstrap over the {self.samples} validation samples every run shares"
        else:
            what = (f"a bootstrap over {self.samples} validation samples, which the runs do not all share (each size "
                    "scored on its own split: unpaired where they differ)")
        gap = f"; {len(self.missing)} run(s) without per-sample results add none" if self.missing else ""
        return f"validation-sample noise is in the intervals: {what}{gap}"


def val_noise(runs: list[Run], metric: str, n_boot: int, seed: int) -> ValNoise:
    """Per-run bootstrap shifts of `metric` from the runs' per-sample validation results."""
    column = COLUMN.get(metric)
    out = ValNoise(metric)
    have = [r for r in runs if column and column in r.val_samples]
    out.missing = [r.run_id for r in runs if r not in have]
    if not have or n_boot <= 0:
        return out
    sets, tokens = _val_sets(have)
    indices = set().union(*tokens)
    out.sets, out.samples = len(tokens), len(indices)
    out.shared = out.sets == 1 and all(len(np.unique(r.val_samples["index"])) == out.samples for r in have)
    # runs of one set agree wherever they share an index, so an index differs exactly where the sets' maps do
    out.differing = sum(len({t[i] for t in tokens if i in t}) > 1 for i in indices)
    # one bootstrap count per (set, index): shared within a set, drawn afresh for each other set
    keys = [[(k, i) for i in r.val_samples["index"].tolist()] for k, r in zip(sets, have)]
    universe = {key: i for i, key in enumerate(sorted({key for run in keys for key in run}))}
    counts = np.random.default_rng(seed).poisson(1.0, size=(n_boot, len(universe))).astype(float)
    for r, run_keys in zip(have, keys):
        pos = np.array([universe[key] for key in run_keys])
        w, v = r.val_samples["tokens"], r.val_samples[column]
        full = float((w * v).sum() / w.sum())
        cw = counts[:, pos] * w[None, :]
        out.shifts[r.run_id] = (cw @ v) / np.maximum(cw.sum(axis=1), 1e-300) - full
    return out


def _val_sets(runs: list[Run]) -> tuple[list[int], list[dict[float, float]]]:
    """A set number per run, and each set's token counts by index: a run joins the first set it shares indices
    with and agrees with in token count everywhere, so a run on a subset that agrees with two sets never joins them
    into one. The grouping follows the runs' order and may split what is one set (disjoint indices bridged only
    later): intervals wider, never paired across other answers."""
    sets: list[dict[float, float]] = []  # each set's tokens by index, over its runs so far
    out = []
    for r in runs:
        tokens = dict(zip(r.val_samples["index"].tolist(), r.val_samples["tokens"].tolist()))
        for number, known in enumerate(sets):
            common = tokens.keys() & known.keys()
            if common and all(tokens[k] == known[k] for k in common):
                known.update(tokens)
                break
        else:
            number = len(sets)
            sets.append(tokens)
        out.append(number)
    return out, sets

"""The analysis input model: one record per sweep child run, normalised into `Run`s.

A record is a plain dict (what `tracking.mlflow_source.load_records` returns, and what tests build by hand):

    {"run_id": "...",                          # optional
     "params": {"data.samples": 800, "extract.layers": "auto", "train.seed": 1, ...},  # dotted config keys
     "metrics": {"train/train_tokens": 2.1e7, "val/loss": 6.13, "train/loss": 6.0, "bench/tau": 2.9,
                 "val/acc_0": 0.745, "train/steps": 1520, "train/stopped_early": 1,
                 "generate/seconds": 98.8, ...},      # final values
     "history": {"val/loss": [(step, value), ...], "train/loss": [...]},  # optional, per epoch or step
     "tags": {"code.train": "...", "code.extract": "..."},  # optional: the stages' code hashes
     "val_samples": {"index": [...], "loss": [...], "tau": [...], "tokens": [...]}}  # optional, per val sample

Params may be strings (MLflow stores them so); they are parsed back to ints, floats, lists, None.
N, the data size, is the first of `N_SOURCES` that every record has, so one sweep never mixes units.
S, the optimizer steps a run took, is `train/steps`; a run converged when early stopping fired
(`train/stopped_early` = 1). The budget keys (`BUDGET_KEYS`) are the steps axis, not factors; a run with
`train.extend_steps` > 0 is a steps probe: it trained on past its plateau at constant learning rate.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from draftlab.analysis.stats import pooled_sd
from draftlab.util.fsutil import atomic_write_with
from draftlab.plan.stage_keys import fingerprinted

# Distinct training tokens first (the x-axis of a data-scaling law), samples only as a last resort.
N_SOURCES = ("metrics:train/train_tokens", "metrics:extract/tokens", "params:data.samples")
# Keys that only change which replicate a run is, not what is being compared: their spread is the noise.
REPLICATE_KEYS = ("train.seed", "data.seed", "bench.seed")
# The steps axis: how long a run trains is read from its metrics (train/steps, train/stopped_early), so the keys
# that set it are an axis, not a factor to compare configs on.
BUDGET_KEYS = ("train.max_steps", "train.epochs", "train.eval_every", "train.early_stop_patience",
               "train.early_stop_min_delta", "train.plateau_test", "train.early_stop_level", "train.extend_steps")
STEPS_KEY, STOPPED_KEY, PROBE_KEY = "train/steps", "train/stopped_early", "train.extend_steps"
# The code a run's numbers depend on: the train and extract stages' code hashes (pipeline tags `code.<stage>`);
# records from before those tags fall back on the commit that produced each stage's output.
CODE_TAGS = (("code.train", "train/produced_by"), ("code.extract", "extract/produced_by"))
# Keys that change nothing a run measures (where and how fast it ran, how it was tracked) are not factors: the
# stage registry's list decides it (`stage_keys.fingerprinted`), so a key added there is never a factor here.
# Metric names: lower-is-better unless listed as higher-is-better.
# best/val_loss first: the exported draft is the best validation pass (early stopping may end after it)
LOSS_KEYS = ("best/val_loss", "val/loss")
TAU_KEY = "bench/tau"
PREDICTED_TAU_KEY = "val/predicted_tau"
HIGHER_IS_BETTER_PREFIXES = ("bench/tau", "val/acc", "val/predicted_tau")


def parse_param(value: Any) -> Any:
    """MLflow param strings back to values: '800' -> 800, '[1, 3]' -> [1, 3], 'None' -> None, 'auto' -> 'auto'."""
    if not isinstance(value, str):
        return value
    if value in ("None", "null", ""):
        return None
    for kind in (int, float):  # before YAML, which (1.1) reads '1e-3' as a string
        try:
            return kind(value)
        except ValueError:
            pass
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    return parsed if isinstance(parsed, (int, float, list, bool)) or parsed is None else value


def label(value: Any) -> str:
    """A short, stable label for a param value (lists as '[1,3,4]')."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def direction(metric: str) -> int:
    """+1 when higher is better (tau, accuracy), -1 when lower is better (losses)."""
    return 1 if metric.startswith(HIGHER_IS_BETTER_PREFIXES) else -1


@dataclass
class Run:
    run_id: str
    params: dict[str, Any]
    metrics: dict[str, float]
    history: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    n: float = math.nan  # data size on the chosen scale
    group: Any = None  # runs with the same group share a dataset (same data.samples, or same N)
    config: tuple = ()  # the factor settings: params minus N, replicate, budget and bookkeeping keys
    tags: dict[str, str] = field(default_factory=dict)
    val_samples: dict[str, np.ndarray] = field(default_factory=dict)  # index, loss, tau, tokens per val sample

    @property
    def steps(self) -> float:
        """Optimizer steps the run took (NaN when the record does not say)."""
        return self.value(STEPS_KEY)

    @property
    def converged(self) -> bool:
        """Early stopping fired: more steps at this learning-rate schedule no longer helped."""
        return self.value(STOPPED_KEY) == 1.0

    @property
    def probe(self) -> bool:
        """A steps probe: early stopping fired, then `train.extend_steps` more steps at constant learning rate."""
        extend = self.params.get(PROBE_KEY)
        return isinstance(extend, (int, float)) and extend > 0

    @property
    def code(self) -> tuple[str, ...]:
        """The train and extract code the run's numbers come from ('?' where the record does not say; a commit
        recorded as 'unknown', from a tree without git, says nothing either)."""
        found = (self.tags.get(tag) or self.tags.get(fallback) for tag, fallback in CODE_TAGS)
        return tuple(v if v and v != "unknown" else "?" for v in found)

    def value(self, metric: str) -> float:
        v = self.metrics.get(metric)
        return float(v) if v is not None and math.isfinite(float(v)) else math.nan


def is_factor_key(key: str) -> bool:
    """A setting runs are compared on: part of a stage's cache key, and neither N, a replicate nor the budget."""
    return fingerprinted(key) and not (key in REPLICATE_KEYS or key in BUDGET_KEYS or key == "data.samples")


def _config(params: dict[str, Any], skip: frozenset = frozenset()) -> tuple:
    return tuple(sorted((k, label(v)) for k, v in params.items() if is_factor_key(k) and k not in skip))


def keys_only_newer_runs_log(all_params: list[dict[str, Any]]) -> frozenset:
    """Factor keys that some records lack and the rest agree on: settings that newer code logs and older code
    did not have (`data.engine` came after the first H200 runs). Comparing on them would split one sweep into
    "absent" and "present"; a key whose recorded values differ stays a factor, absent included."""
    present: dict[str, set] = defaultdict(set)
    for params in all_params:
        for k, v in params.items():
            if is_factor_key(k):
                present[k].add(label(v))
    return frozenset(k for k, vals in present.items()
                     if len(vals) == 1 and not all(k in params for params in all_params))


def n_source(records: list[dict]) -> str:
    """The first N source present in every record; ValueError if none is."""
    for source in N_SOURCES:
        kind, key = source.split(":", 1)
        if records and all(parse_param(r.get(kind, {}).get(key)) is not None for r in records):
            return source
    raise ValueError("no data size in the records: need metrics train/train_tokens or extract/tokens, "
                     "or param data.samples, in every record")


def read_records(path: Path) -> list[dict]:
    """Records from a JSON list or a JSON-lines file, gzip-compressed when its name ends in .gz."""
    raw = Path(path).read_bytes()
    text = (gzip.decompress(raw) if Path(path).suffix == ".gz" else raw).decode()
    if text.lstrip().startswith("["):
        return json.loads(text)
    # JSON lines end at "\n" alone: splitlines() would also cut at U+2028 and the like, legal inside a string
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def write_records(path: Path, records: list[dict]) -> None:
    """`read_records`' JSON lines, one record a line in the given order, gzip-compressed for a .gz name."""
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode()
    data = gzip.compress(text, mtime=0) if Path(path).suffix == ".gz" else text  # mtime 0: same records, same bytes
    atomic_write_with(Path(path), lambda tmp: tmp.write_bytes(data))


def normalise(records: list[dict]) -> tuple[list[Run], str]:
    """Records -> Runs with parsed params, N and config key; also returns the N source used."""
    source = n_source(records)
    kind, key = source.split(":", 1)
    runs = []
    parsed = [{k: parse_param(v) for k, v in r.get("params", {}).items()} for r in records]
    skip = keys_only_newer_runs_log(parsed)
    for i, (r, params) in enumerate(zip(records, parsed)):
        metrics = {k: float(v) for k, v in r.get("metrics", {}).items() if v is not None}
        history = {k: sorted((float(s), float(v)) for s, v in h) for k, h in (r.get("history") or {}).items()}
        n = float(parse_param(r[kind][key]))
        # Same data.samples means the same dataset even if a token count differs by a rounding; else N itself.
        group = params.get("data.samples", n)
        runs.append(Run(str(r.get("run_id", i)), params, metrics, history, n, group, _config(params, skip),
                        {k: str(v) for k, v in (r.get("tags") or {}).items()}, _val_samples(r.get("val_samples"))))
    return runs, source


def _val_samples(raw: dict | None) -> dict[str, np.ndarray]:
    """Per-sample validation results as arrays of one length (tokens weigh each sample as the totals do)."""
    if not raw or not raw.get("index"):
        return {}
    out = {k: np.asarray(v, dtype=float) for k, v in raw.items() if k in ("index", "loss", "tau", "tokens")}
    if len({a.size for a in out.values()}) != 1:
        raise ValueError("val_samples: index, loss, tau and tokens must have one length")
    out.setdefault("tokens", np.ones_like(out["index"]))
    return out


def by_group(runs: list[Run]) -> list[tuple[float, list[Run]]]:
    """Runs grouped by dataset, as (N, runs) sorted by N; N is the group's median."""
    groups: dict[Any, list[Run]] = defaultdict(list)
    for r in runs:
        groups[r.group].append(r)
    out = [(float(np.median([r.n for r in g])), g) for g in groups.values()]
    return sorted(out, key=lambda t: t[0])


def values(runs: list[Run], metric: str) -> np.ndarray:
    v = np.array([r.value(metric) for r in runs], dtype=float)
    return v[np.isfinite(v)]


def baseline_config(runs: list[Run]) -> tuple:
    """The config the data sweep varies N for: the one seen at the most data sizes (then the most runs)."""
    sizes: dict[tuple, set] = defaultdict(set)
    counts: Counter = Counter()
    for r in runs:
        sizes[r.config].add(r.group)
        counts[r.config] += 1
    return max(sizes, key=lambda c: (len(sizes[c]), counts[c]))


def loss_key(runs: list[Run]) -> str | None:
    """The validation loss metric present in the runs (best/val_loss, else val/loss)."""
    for key in LOSS_KEYS:
        if any(math.isfinite(r.value(key)) for r in runs):
            return key
    return None


def step_clusters(runs: list[Run], tolerance: float = 0.1) -> dict[str, float]:
    """run_id -> the step budget it shares with others: steps within `tolerance` of each other (380 and 384,
    from token-budget batching) are one budget. Converged runs and runs without a step count are left out."""
    budget = sorted((r.steps, r.run_id) for r in runs if math.isfinite(r.steps) and not r.converged)
    out, members = {}, []
    for steps, run_id in budget + [(math.inf, "")]:
        if members and steps > members[0][0] * (1.0 + tolerance):
            centre = float(np.median([s for s, _ in members]))
            out.update({rid: centre for _, rid in members})
            members = []
        members.append((steps, run_id))
    return out


def cell_key(r: Run, clusters: dict[str, float]) -> tuple:
    """Runs in one cell differ only in their replicate keys: same config, dataset and step budget (or both
    converged)."""
    return (r.config, r.group, "probe" if r.probe else "converged" if r.converged else clusters.get(r.run_id, math.nan))


def metric_noise(runs: list[Run], metric: str) -> tuple[float, int]:
    """Pooled seed-to-seed sd of a metric over all (config, dataset, step budget) cells holding replicates."""
    clusters = step_clusters(runs)
    cells: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        cells[cell_key(r, clusters)].append(r)
    return pooled_sd(values(c, metric) for c in cells.values())


def differs_only_in(a: tuple, b: tuple, key: str) -> bool:
    """True when two configs are equal once `key` is left out of both."""
    return [kv for kv in a if kv[0] != key] == [kv for kv in b if kv[0] != key]

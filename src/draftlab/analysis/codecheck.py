"""One code version per comparison: the runs of one verdict must share the train and extract stages' code.

A run's code is its `code.train` and `code.extract` tags (the stages' code hashes, draftlab.provenance.code_version),
else the commits that produced those stages' outputs (`<stage>/produced_by`), else unknown. Runs whose code is
unknown are not counted as differing: records from before either tag existed say nothing either way.
"""

from __future__ import annotations

from collections import defaultdict

from draftlab.analysis.records import Run


def code_groups(runs: list[Run]) -> dict[tuple[str, ...], list[Run]]:
    """Known code versions -> their runs (runs whose code is wholly unknown are left out)."""
    groups: dict[tuple[str, ...], list[Run]] = defaultdict(list)
    for r in runs:
        if any(part != "?" for part in r.code):
            groups[r.code].append(r)
    return dict(groups)


def mixed_code(runs: list[Run]) -> str:
    """'' when the runs share one code version; else a sentence naming the versions and the runs on each,
    the largest group first (the others are the ones that differ)."""
    groups = sorted(code_groups(runs).items(), key=lambda kv: (-len(kv[1]), kv[0]))
    if len(groups) < 2:
        return ""
    seen: dict[str, set] = defaultdict(set)
    for r in runs:
        for k, v in r.config:
            seen[k].add(v)
    varying = {k for k, vs in seen.items() if len(vs) > 1}
    parts = []
    for (train, extract), members in groups:
        names = ", ".join(_name(r, varying) for r in members)
        parts.append(f"train {train[:12]} / extract {extract[:12]}: {names}")
    return f"the runs ran on {len(groups)} code versions ({'; '.join(parts)})"


def _name(r: Run, varying: set[str]) -> str:
    """A run as a reader finds it: its id and what sets it apart (N, seed, the factors that vary)."""
    what = [f"samples={r.params.get('data.samples')}", f"seed={r.params.get('train.seed')}"]
    what += [f"{k}={v}" for k, v in r.config if k in varying]
    return f"{r.run_id} ({', '.join(what)})"

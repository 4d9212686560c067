"""python -m draftlab intervals PATH/per_prompt.json: a bench result's intervals re-derived from its per-prompt table.

The bench stage writes per_prompt.json ({"sets": [...], "rows": [...]}, one row a prompt) beside its metrics; this
command recomputes each set's (and, where an `engine` column exists, each engine's) tau and speed-up with their 95%
bootstrap intervals by the same code and seed as the stage (stats/intervals.py's set_metrics), plus tau without the
prefill's first token (committed tokens less one a prompt, per verify step: the count that leaves out the token
plain decoding's prefill gives for free) and the share of prompts whose answer matches plain decoding's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftlab.config.config import ConfigError
from draftlab.stats.intervals import set_metrics


def groups(table: dict) -> dict[str, list[dict]]:
    """The rows by set, and by set and engine where the table has an engine column, in the table's order."""
    out: dict[str, list[dict]] = {}
    for row in table["rows"]:
        key = row["set"] + (f" [{row['engine']}]" if row.get("engine") is not None else "")
        out.setdefault(key, []).append(row)
    return out


def rederive(table: dict, seed: int = 0) -> dict[str, dict[str, float]]:
    """For each group: tau, speedup (with _lo, _hi), tau_excl_prefill (with _lo, _hi), prompts, greedy_match_frac."""
    result = {}
    for key, rows in groups(table).items():
        num_steps = max([0, *(max(r["accepted"]) for r in rows if r.get("accepted"))])  # the most accepted a step
        m = set_metrics("s", rows, num_steps, seed)
        less = set_metrics("s", [{**r, "tokens": max(r["tokens"] - 1, 0)} for r in rows], num_steps, seed)
        out = {k: m[f"s/{k}"] for k in ("tau", "tau_lo", "tau_hi", "speedup", "speedup_lo", "speedup_hi", "prompts")}
        out.update({f"tau_excl_prefill{end}": less[f"s/tau{end}"] for end in ("", "_lo", "_hi")})
        matches = [r["greedy_match"] for r in rows if "greedy_match" in r]
        out["greedy_match_frac"] = sum(map(bool, matches)) / len(matches) if matches else None
        result[key] = out
    return result


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m draftlab intervals", description=__doc__.splitlines()[0])
    ap.add_argument("table", type=Path, help="a bench result's per_prompt.json")
    ap.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (the stage uses bench.seed, default 0)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    try:
        table = json.loads(args.table.read_text())
        rows = table["rows"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{args.table}: not a bench per_prompt.json ({type(err).__name__}: {err})") from None
    if not rows:
        raise ConfigError(f"{args.table}: no prompt rows")
    result = rederive(table, args.seed)
    if args.json:
        print(json.dumps(result))
        return 0
    print("| set | prompts | tau (95%) | tau without the prefill token (95%) | speed-up (95%) | greedy match |")
    print("|---|---|---|---|---|---|")
    for key, m in result.items():
        match = "-" if m["greedy_match_frac"] is None else f"{m['greedy_match_frac']:.0%}"
        print(f"| {key} | {m['prompts']:.0f} | {m['tau']:.2f} ({m['tau_lo']:.2f}-{m['tau_hi']:.2f}) | "
              f"{m['tau_excl_prefill']:.2f} ({m['tau_excl_prefill_lo']:.2f}-{m['tau_excl_prefill_hi']:.2f}) | "
              f"{m['speedup']:.2f}x ({m['speedup_lo']:.2f}-{m['speedup_hi']:.2f}) | {match} |")
    return 0

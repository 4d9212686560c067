"""python -m draftlab intervals: a bench result's intervals re-derived from a small synthetic per-prompt table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from draftlab.stats.intervals import set_metrics
from draftlab.serve.rederive import rederive


def _row(set_, i, tokens, steps, engine=None, match=True):
    row = {"set": set_, "prompt": i, "tokens": tokens, "verify_steps": steps, "accepted": [1] * steps,
           "spec_s": steps * 0.01, "baseline_tokens": tokens, "base_s": tokens * 0.01, "greedy_match": match}
    return row if engine is None else {**row, "engine": engine}


def _table(engine=None):
    rows = [_row("a", i, 20 + i, 10, engine, match=i % 4 != 0) for i in range(12)]
    rows += [_row("b", i, 30, 10 + i % 3, engine) for i in range(12)]
    return {"sets": ["a", "b"], "rows": rows}


def test_intervals_match_the_stage_and_leave_out_the_prefill_token():
    table = _table()
    result = rederive(table, seed=0)
    assert list(result) == ["a", "b"]
    a_rows = [r for r in table["rows"] if r["set"] == "a"]
    stage = set_metrics("bench/a", a_rows, 1, 0)
    for key in ("tau", "tau_lo", "tau_hi", "speedup", "speedup_lo", "speedup_hi"):
        assert result["a"][key] == pytest.approx(stage[f"bench/a/{key}"])
    tokens, steps = sum(r["tokens"] for r in a_rows), sum(r["verify_steps"] for r in a_rows)
    assert result["a"]["tau"] == pytest.approx(tokens / steps)
    assert result["a"]["tau_excl_prefill"] == pytest.approx((tokens - len(a_rows)) / steps)
    assert result["a"]["tau_lo"] < result["a"]["tau"] < result["a"]["tau_hi"]
    assert result["a"]["greedy_match_frac"] == pytest.approx(9 / 12)
    assert result["b"]["greedy_match_frac"] == 1.0


def test_an_engine_column_splits_each_set(tmp_path):
    table = _table("local")
    table["rows"] += [{**r, "engine": "sglang", "tokens": r["tokens"] + 5} for r in _table()["rows"]]
    path = tmp_path / "per_prompt.json"
    path.write_text(json.dumps(table))
    out = subprocess.run([sys.executable, "-m", "draftlab", "intervals", str(path), "--json"], check=True,
                         capture_output=True, text=True).stdout
    result = json.loads(out)
    assert sorted(result) == ["a [local]", "a [sglang]", "b [local]", "b [sglang]"]
    assert result["a [sglang]"]["tau"] > result["a [local]"]["tau"]
    assert result["a [local]"]["prompts"] == 12
    assert result["a [local]"]["tau_excl_prefill_lo"] < result["a [local]"]["tau_excl_prefill_hi"]
    text = subprocess.run([sys.executable, "-m", "draftlab", "intervals", str(path)], check=True,
                          capture_output=True, text=True).stdout
    assert text.count("\n| a [") == 2 and "| b [sglang] | 12 |" in text

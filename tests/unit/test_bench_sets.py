"""bench.sets entries (data/bench_sets.py) and a set's intervals (stats/intervals.py)."""

from __future__ import annotations

import pytest

from draftlab.data.bench_sets import humaneval_prompts, parse_sets, set_texts
from draftlab.stats.intervals import MIN_PROMPTS, TOO_WIDE, decidable, set_metrics


def test_humaneval_is_the_packages_164_prompts_in_task_order():
    prompts = humaneval_prompts()
    assert len(prompts) == 164 and len(set(prompts)) == 164
    assert prompts[0].startswith("from typing import List") and "has_close_elements" in prompts[0]


def test_entries_resolve_to_named_sets(tmp_path):
    mine = tmp_path / "my prompts.v2.jsonl"
    mine.write_text('{"prompt": "b"}\n{"text": "a"}\n')
    sets = parse_sets(["sharegpt_val", "humaneval", str(mine)])
    assert [(s.name, s.kind) for s in sets] == [("sharegpt_val", "sharegpt_val"), ("humaneval", "humaneval"),
                                                ("my_prompts.v2", "jsonl")]
    assert sorted(set_texts(sets[2], seed=0)) == ["a", "b"]


@pytest.mark.parametrize("entries,clue", [
    ("humaneval", "a non-empty list"), ([], "a non-empty list"), (["mbpp"], "neither"),
    (["/nowhere/p.jsonl"], "does not exist"), (["humaneval", "humaneval"], "two sets are named 'humaneval'")])
def test_bad_entries_name_the_key(entries, clue):
    with pytest.raises(ValueError, match=clue) as err:
        parse_sets(entries)
    assert str(err.value).startswith("bench.sets: ")


def _rows(taus: list[float], steps: int = 20) -> list[dict]:
    return [{"tokens": tau * steps, "verify_steps": steps, "spec_s": 1.0, "baseline_tokens": 10, "base_s": 1.0,
             "accepted": [1] * steps} for tau in taus]


def test_intervals_hold_the_point_are_seeded_and_narrow_with_more_prompts():
    few = set_metrics("bench/s", _rows([1.5, 2.5, 2.0, 3.0]), 2, seed=0)
    assert few["bench/s/tau"] == pytest.approx(2.25)
    assert few["bench/s/tau_lo"] < few["bench/s/tau"] < few["bench/s/tau_hi"]
    assert few == set_metrics("bench/s", _rows([1.5, 2.5, 2.0, 3.0]), 2, seed=0)
    many = set_metrics("bench/s", _rows([1.5, 2.5, 2.0, 3.0] * 25), 2, seed=0)
    assert many["bench/s/tau_hi"] - many["bench/s/tau_lo"] < few["bench/s/tau_hi"] - few["bench/s/tau_lo"]
    assert few["bench/s/accept_rate_0"] == 1.0 and few["bench/s/accept_rate_1"] == 0.0
    assert few["bench/s/tau_decidable"] == 0.0 and many["bench/s/tau_decidable"] == 1.0
    spread = set_metrics("bench/s", _rows([1.0, 4.0] * 10), 2, seed=0)  # enough prompts, too far apart
    assert spread["bench/s/tau_decidable"] == 0.0


def test_what_decides_nothing():
    assert decidable(2.0, 1.95, 2.05, MIN_PROMPTS)
    assert not decidable(2.0, 1.95, 2.05, MIN_PROMPTS - 1)  # too few prompts, however narrow
    assert not decidable(2.0, 2.0 - TOO_WIDE, 2.0 + TOO_WIDE + 0.01, 80)  # wider than TOO_WIDE of the value
    assert not decidable(float("nan"), 1.0, 2.0, 80)

"""The analysis' input model: which settings runs are compared on, and what a training step costs."""

from __future__ import annotations

import pytest

from conftest import compose_config
from draftlab.analysis.axes import stage_costs
from draftlab.analysis.records import normalise, read_records, write_records
from draftlab.config.config import validate
from draftlab.tracking.run_context import flatten
from draftlab.plan.stage_keys import NOT_FINGERPRINTED, fingerprinted


def _record(samples=800, seed=0, **params):
    p = {"data.samples": samples, "train.seed": seed, "extract.layers": "auto", "train.lr": 1e-3, **params}
    return {"params": {k: str(v) for k, v in p.items()}, "metrics": {"val/loss": 6.0, "train/steps": 100}}


@pytest.mark.parametrize("key, value", [
    ("data.server.model", "other-name"),     # a generation server's served-model name
    ("train.checkpoint_every", 999),          # where a run may resume from, not what it ends with
    ("serve.startup_timeout_s", 60),          # how long to wait for SGLang
    ("hardware.name", "gpu"),                 # a preset's label: its values are compared key by key
    ("train.device", "cuda"), ("target.device_map", "auto"), ("tracking.run_name", "mine"),
])
def test_settings_that_never_split_a_cache_are_not_factors(key, value):
    """Runs that differ only in how or where they ran are one config; the one list is stage_keys'."""
    runs, _ = normalise([_record(), _record(seed=1, **{key: value})])
    assert runs[0].config == runs[1].config, key


def test_settings_that_split_a_cache_are_factors():
    runs, _ = normalise([_record(), _record(seed=1, **{"train.lr": 3e-4}),
                         _record(seed=1, **{"extract.layers": "last"})])
    assert len({r.config for r in runs}) == 3


def test_a_key_older_runs_did_not_log_does_not_split_the_sweep():
    """Older code never logged data.engine; newer runs log its one value: still one config. A key whose logged
    values differ, or that every run logs, stays a factor."""
    old, new = _record(), _record(samples=1600, **{"data.engine": "hf"})
    runs, _ = normalise([old, new])
    assert runs[0].config == runs[1].config
    runs, _ = normalise([old, new, _record(samples=3200, **{"data.engine": "server"})])
    assert len({r.config for r in runs}) == 3  # absent, hf and server are three settings
    runs, _ = normalise([_record(**{"data.engine": "hf"}), _record(seed=1, **{"data.engine": "server"})])
    assert runs[0].config != runs[1].config


def test_every_config_key_is_a_factor_exactly_when_a_stage_key_holds_it():
    keys = flatten(validate(compose_config()))
    assert not any(fingerprinted(k) for k in keys if k.split(".")[0] in ("tracking", "paths", "hardware", "stages"))
    assert not any(fingerprinted(k) for k in keys if any(k == s or k.startswith(s + ".") for s in NOT_FINGERPRINTED))
    assert all(fingerprinted(k) for k in ("train.lr", "draft.num_layers", "extract.layers", "data.max_new_tokens",
                                          "serve.num_steps", "target.tiny.num_layers", "bench.prompts"))


def _costed(steps, seconds, **metrics):
    record = _record()
    record["metrics"].update({"train/steps": steps, "train/seconds": seconds, "train/cached": 0.0, **metrics})
    return record


def test_a_resumed_job_is_priced_by_the_steps_its_own_process_took():
    """A job killed at step 800 of 1000 and resumed: its train/seconds are the last process's, for 200 steps."""
    runs, _ = normalise([_costed(1000, 100.0, **{"train/new_steps": 200})])
    assert stage_costs(runs)["train_s_per_step"] == pytest.approx(0.5)
    # an uninterrupted run (or an older record without the count) divides by all its steps
    runs, _ = normalise([_costed(1000, 100.0, **{"train/new_steps": 1000}), _costed(400, 40.0)])
    assert stage_costs(runs)["train_s_per_step"] == pytest.approx(0.1)
    # a resumed job that found its run finished trained nothing: it prices nothing
    runs, _ = normalise([_costed(1000, 3.0, **{"train/new_steps": 0})])
    assert "train_s_per_step" not in stage_costs(runs)


def test_records_whose_text_holds_line_separators_read_back(tmp_path):
    """A JSON string may hold U+2028 or U+001C unescaped (another tool's records): only "\n" ends a line."""
    import gzip
    import json

    records = [{"run_id": "a\u2028b", "params": {"note": "x\x1cy\x85z"}}, {"run_id": "c"}]
    text = "\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n"
    (tmp_path / "records.jsonl").write_text(text)
    (tmp_path / "records.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    assert read_records(tmp_path / "records.jsonl") == read_records(tmp_path / "records.jsonl.gz") == records
    write_records(tmp_path / "again.jsonl.gz", records)
    assert read_records(tmp_path / "again.jsonl.gz") == records

"""Data identity: the generate pool is keyed by the prompt file's contents, not only its path, so an edited
file gets a new pool and a pool never mixes two files."""

import json
import os

from draftlab.config.config import validate
from draftlab.data.samples import read_samples
from draftlab.plan.stage_keys import content_sha256, plan
from draftlab.task import run_task


def _write_prompts(path, word, count):
    path.write_text("\n".join(json.dumps({"prompt": f"{word} question number {i}"}) for i in range(count)))


def _prompts_in(folder):
    return [sample.prompt for sample in read_samples(folder, with_text=True)]


def test_an_edited_prompt_file_gets_a_new_pool_of_its_own_samples(tiny_cfg, tmp_path):
    path = tmp_path / "prompts.jsonl"
    _write_prompts(path, "old", 8)
    args = ("data.source=jsonl", f"data.path={path}", "stages=[generate]", "tracking.enabled=false")
    first = run_task(tiny_cfg(*args, "data.samples=8"))
    old_pool = plan(validate(tiny_cfg(*args, "data.samples=8")))["generate"].folder
    assert first["generate/new_samples"] == 8

    _write_prompts(path, "new", 8)  # same size, new contents: the path alone cannot tell
    again = run_task(tiny_cfg(*args, "data.samples=8"))
    assert again["generate/cached"] == 0 and again["generate/new_samples"] == 8
    new_pool = plan(validate(tiny_cfg(*args, "data.samples=8")))["generate"].folder
    assert new_pool != old_pool
    assert all(p.startswith("new ") for p in _prompts_in(new_pool))

    # Growing the pool after the edit takes prompts of the new file only.
    _write_prompts(path, "new", 16)
    grown = run_task(tiny_cfg(*args, "data.samples=16"))
    grown_pool = plan(validate(tiny_cfg(*args, "data.samples=16")))["generate"].folder
    assert grown["generate/samples"] == 16
    prompts = _prompts_in(grown_pool)
    assert len(prompts) == 16 and all(p.startswith("new ") for p in prompts)
    assert all(p.startswith("old ") for p in _prompts_in(old_pool))  # the old pool is left as it was


def test_the_content_hash_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    from draftlab.plan import stage_keys

    path = tmp_path / "p.jsonl"
    path.write_text("a")
    calls = []
    real = stage_keys.file_sha256
    monkeypatch.setattr(stage_keys, "file_sha256", lambda p: calls.append(p) or real(p))
    first = content_sha256(path, tmp_path / "cache")
    assert content_sha256(path, tmp_path / "cache") == first and len(calls) == 1  # read once
    path.write_text("b")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1000))
    assert content_sha256(path, tmp_path / "cache") != first and len(calls) == 2


def test_an_edited_bench_set_file_changes_the_bench_key_only(tiny_cfg, tmp_path):
    path = tmp_path / "mine.jsonl"
    _write_prompts(path, "old", 4)
    args = (f"bench.sets=[sharegpt_val,{path}]",)
    before = plan(validate(tiny_cfg(*args)))
    _write_prompts(path, "new", 4)  # same size, new contents
    os.utime(path, ns=(1, 1))  # and an old mtime: the contents, not the stamp, must tell
    after = plan(validate(tiny_cfg(*args)))
    assert after["bench"].key != before["bench"].key
    assert all(after[s].key == before[s].key for s in ("generate", "extract", "train"))

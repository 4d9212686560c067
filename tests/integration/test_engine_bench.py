"""The engine benchmark's scripts run end to end on the tiny target (an H200 job runs them once, unattended):
probe_draft.py writes a loadable draft, slim_draft.py a smaller one served identically, and spec_decode.py
measures each mode with the same greedy output. Their numbers are never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import benchmark_script as _script


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("probe") / "draft"
    _script("probe_draft").main(["--target", "tiny", "--out", str(folder), "--agree"])
    return folder


def test_spec_decode_measures_each_mode(probe, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tell me about the number {i}.", "id": f"c{i}"}) + "\n"
                               for i in range(300)))
    out = tmp_path / "rows.json"
    rows = _script("spec_decode").main([
        "--target", "tiny", "--draft", str(probe), "--device", "cpu", "--dtype", "float32", "--prompts-jsonl",
        str(prompts), "--prompts", "2", "--max-new-tokens", "12", "--modes", "dynamic", "static",
        "--num-steps", "2", "4", "--out", str(out)])
    assert [(r["mode"], r["num_steps"]) for r in rows] == [("dynamic", 2), ("dynamic", 4), ("static", 2),
                                                           ("static", 4)]
    assert json.loads(out.read_text()) == rows
    for row in rows:
        assert row["greedy_match_frac"] == 1.0 and row["prompts"] == 2
        assert row["step_ms"] > 0 and row["cycle_ms"] > 0 and "speedup_vs_dynamic_plain" in row
    assert rows[0]["tau"] == rows[2]["tau"] and rows[1]["tau"] == rows[3]["tau"]  # same drafts in both modes
    assert set(rows[3]["graphs"].values()) == {"eager"}  # on the CPU the fixed-shape steps run eagerly
    with pytest.raises(SystemExit):  # graphs need CUDA: refused before any model loads
        _script("spec_decode").main(["--target", "tiny", "--draft", str(probe), "--modes", "graphs"])


def test_slim_draft_serves_identically(probe, tmp_path, capsys):
    _script("slim_draft").main([str(probe), str(tmp_path / "slim"), "--target", "tiny"])
    assert "served identically" in capsys.readouterr().out
    full, slim = (p / "model.safetensors" for p in (probe, tmp_path / "slim"))
    assert slim.stat().st_size < full.stat().st_size

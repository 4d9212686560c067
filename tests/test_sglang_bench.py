"""run_sglang_bench end to end against the stand-in server (a test double, not SGLang)."""

import json
import sys
from pathlib import Path

import pytest

from draftlab.config import default_config
from draftlab.reporting import RecordingReporter
from draftlab.sglang.bench import DraftCheckError, run_sglang_bench
from draftlab.sglang.client import SGLangClient, SGLangClientError
from draftlab.sglang.formats import convert
from draftlab.sglang.monitor import free_port
from sglang_fixtures import write_draft, write_target

STANDIN = [sys.executable, str(Path(__file__).with_name("standin_sglang_server.py"))]


def config(**serve):
    base = {"backend": "sglang", "num_steps": 3, "topk": 1, "port": free_port(), "startup_timeout_s": 20,
            "extra_args": ["--standin-phase-s", "0.01", "--standin-accept-length", "2.5", "--standin-step-ms", "2"]}
    return default_config({"serve": {**base, **serve},
                           "bench": {"max_new_tokens": 20, "prompts": 3, "batch_sizes": [1, 2]}})


def test_bench_reports_tau_throughput_and_speedup(tmp_path):
    target, draft = write_target(tmp_path / "t"), write_draft(tmp_path / "d")
    reporter = RecordingReporter()
    sets = {"sharegpt_val": [[1, 2, 3], [4, 5], "a text prompt"], "humaneval": [[7, 8], [9]]}
    metrics, rows = run_sglang_bench(config(), target, draft, sets, tmp_path / "out", reporter, server_cmd=STANDIN)
    assert metrics["bench/tau"] == pytest.approx(60 / 24)  # 20 tokens in ceil(20 / 2.5) = 8 verify steps, x3
    assert metrics["bench/server_accept_length"] == pytest.approx(2.5, rel=0.01)
    assert metrics["bench/speedup"] > 1.5
    assert metrics["bench/baseline_tokens_per_s"] > 0
    for name in ("bench/tau", "bench/tokens_per_s", "bench/baseline_tokens_per_s", "bench/speedup",
                 "bench/startup_s", "bench/startup/draft_weights_s", "bench/baseline_startup_s"):
        reporter.last(name)
    # every set the same metric names as the local engine, the server's own accept length counted per set
    for name, count in (("sharegpt_val", 3), ("humaneval", 2)):
        p = f"bench/{name}"
        assert metrics[f"{p}/prompts"] == count and metrics[f"{p}/tau"] == pytest.approx(2.5)
        assert metrics[f"{p}/tau_lo"] <= metrics[f"{p}/tau"] <= metrics[f"{p}/tau_hi"]
        assert metrics[f"{p}/server_accept_length"] == pytest.approx(2.5, rel=0.01)
        assert metrics[f"{p}/speedup_lo"] <= metrics[f"{p}/speedup"] <= metrics[f"{p}/speedup_hi"]
        assert metrics[f"{p}/tau_decidable"] == 0.0  # a handful of prompts decides nothing
    assert metrics["bench/bs2/speedup"] == pytest.approx(
        metrics["bench/bs2/tokens_per_s"] / metrics["bench/bs2/baseline_tokens_per_s"])
    assert metrics["bench/bs1/speedup"] == metrics["bench/speedup"]
    assert [r["set"] for r in rows] == ["sharegpt_val"] * 3 + ["humaneval"] * 2
    saved = json.loads((tmp_path / "out" / "sglang_bench.json").read_text())
    assert len(saved["speculative"]["sharegpt_val"]) == 3 and saved["spec_argv"][2] == "--model-path"
    assert (tmp_path / "out" / "speculative.log").exists() and (tmp_path / "out" / "baseline.log").exists()


def test_failing_draft_is_never_launched(tmp_path):
    target = write_target(tmp_path / "t")
    draft = write_draft(tmp_path / "d", drop=("lm_head.weight",))
    with pytest.raises(DraftCheckError, match="lm_head.weight"):
        run_sglang_bench(config(), target, draft, {"s": [[1, 2]]}, tmp_path / "out", RecordingReporter(),
                         server_cmd=STANDIN)
    assert not (tmp_path / "out" / "speculative.log").exists()
    assert "lm_head.weight" in (tmp_path / "out" / "check-draft.txt").read_text()


def test_legacy_rules_refuse_layers0_names(tmp_path):
    target, draft = write_target(tmp_path / "t"), write_draft(tmp_path / "d")
    with pytest.raises(DraftCheckError, match="layers.0.self_attn.q_proj.weight"):
        run_sglang_bench(config(sglang_rules="legacy"), target, draft, {"s": [[1]]}, tmp_path / "out",
                         RecordingReporter(), server_cmd=STANDIN)


def test_speculators_draft_is_converted_then_benchmarked(tmp_path):
    target = write_target(tmp_path / "t")
    spec = convert(write_draft(tmp_path / "d"), tmp_path / "spec", "speculators")
    metrics, _ = run_sglang_bench(config(), target, spec, {"s": [[1, 2]]}, tmp_path / "out", RecordingReporter(),
                                  server_cmd=STANDIN)
    assert metrics["bench/tau"] > 2
    assert (tmp_path / "out" / "draft-sglang" / "config.json").exists()


def test_client_refuses_non_loopback_hosts():
    with pytest.raises(SGLangClientError, match="loopback"):
        SGLangClient("10.0.0.5", 30000)

"""run_sglang_bench end to end against the stand-in server (a test double, not SGLang)."""

import json
import sys
from pathlib import Path

import pytest

from draftlab.config.config import default_config
from draftlab.util.reporting import RecordingReporter
from draftlab.sglang.bench import DraftCheckError, run_sglang_bench
from draftlab.sglang.client import SGLangClient, SGLangClientError
from draftlab.sglang.formats import convert
from draftlab.sglang.grid import run_grid
from draftlab.tracking.summary import bench_rows
from draftlab.sglang.monitor import free_port
from sglang_fixtures import write_draft, write_target

STANDIN = [sys.executable, str(Path(__file__).resolve().parents[1] / "standin_sglang_server.py")]


def config(bench=None, **serve):
    base = {"backend": "sglang", "num_steps": 3, "topk": 1, "port": free_port(), "startup_timeout_s": 20,
            "extra_args": ["--standin-phase-s", "0.01", "--standin-accept-length", "2.5", "--standin-step-ms", "2"]}
    return default_config({"serve": {**base, **serve},
                           "bench": {"max_new_tokens": 20, "prompts": 3, "batch_sizes": [1, 2], **(bench or {})}})


def settings(cfg) -> tuple:
    """(serve.*, bench.*): what the SGLang bench reads of a config."""
    return cfg.serve, cfg.bench


def test_bench_reports_tau_throughput_and_speedup(tmp_path):
    target, draft = write_target(tmp_path / "t"), write_draft(tmp_path / "d")
    reporter = RecordingReporter()
    sets = {"sharegpt_val": [[1, 2, 3], [4, 5], "a text prompt"], "humaneval": [[7, 8], [9]]}
    metrics, rows = run_sglang_bench(*settings(config()), target, draft, sets, tmp_path / "out", reporter,
                                     server_cmd=STANDIN)
    first = "bench/sglang/sharegpt_val"
    assert metrics[f"{first}/tau"] == pytest.approx(60 / 24)  # 20 tokens in ceil(20 / 2.5) = 8 verify steps, x3
    assert metrics[f"{first}/speedup"] > 1.5
    for name in (f"{first}/tokens_per_s", f"{first}/baseline_tokens_per_s", "bench/sglang/startup_s",
                 "bench/sglang/startup/draft_weights_s", "bench/sglang/baseline_startup_s"):
        reporter.last(name)
    assert not any(k.startswith("bench/") and k.count("/") == 2 and not k.startswith("bench/sglang/")
                   for k in metrics), "SGLang's numbers live under bench/sglang/ only"
    # every set the local engine's metric names, under bench/sglang/; the server's own accept length per set
    for name, count in (("sharegpt_val", 3), ("humaneval", 2)):
        p = f"bench/sglang/{name}"
        assert metrics[f"{p}/prompts"] == count and metrics[f"{p}/tau"] == pytest.approx(2.5)
        assert metrics[f"{p}/tau_lo"] <= metrics[f"{p}/tau"] <= metrics[f"{p}/tau_hi"]
        assert metrics[f"{p}/server_accept_length"] == pytest.approx(2.5, rel=0.01)
        assert metrics[f"{p}/speedup_lo"] <= metrics[f"{p}/speedup"] <= metrics[f"{p}/speedup_hi"]
        assert metrics[f"{p}/tau_decidable"] == 0.0  # a handful of prompts decides nothing
        # 8 steps commit 20 tokens: 12 correct drafts, so 4 steps accept 2 and 4 accept 1 (the histogram)
        assert metrics[f"{p}/accept_length"] == pytest.approx(2.5)
        assert metrics[f"{p}/accept_rate_0"] == pytest.approx(1.0)
        assert metrics[f"{p}/accept_rate_1"] == pytest.approx(0.5)
        assert metrics[f"{p}/accept_rate_2"] == pytest.approx(0.0)
        assert metrics[f"{p}/greedy_match_frac"] == 1.0
    bs2 = "bench/sglang/bs2"
    assert metrics[f"{bs2}/speedup"] == pytest.approx(metrics[f"{bs2}/tokens_per_s"] / metrics[f"{bs2}/baseline_tokens_per_s"])
    assert metrics[f"{bs2}/tau"] == pytest.approx(2.5)
    assert metrics["bench/sglang/bs1/speedup"] == metrics[f"{first}/speedup"]
    assert [r["set"] for r in rows] == ["sharegpt_val"] * 3 + ["humaneval"] * 2
    saved = json.loads((tmp_path / "out" / "sglang_bench.json").read_text())
    assert len(saved["speculative"]["sharegpt_val"]) == 3 and saved["spec_argv"][2] == "--model-path"
    assert saved["batches"]["speculative"]["2"]["requests"] == 4  # 3 prompts cycled to two full rounds of 2
    assert (tmp_path / "out" / "speculative.log").exists() and (tmp_path / "out" / "baseline.log").exists()


def test_grid_measures_each_setting_and_fits_the_step_costs(tmp_path):
    target, draft = write_target(tmp_path / "t"), write_draft(tmp_path / "d")
    cfg = config({"sglang_grid": [[2, 1], [3, 1], [3, 2, 4]], "batch_sizes": [1]},
                 extra_args=["--standin-phase-s", "0.01", "--standin-accept-length", "2.5", "--standin-step-ms", "4",
                             "--standin-draft-ms", "1"])
    prompts = [[1, 2], [3]]
    _, rows = run_sglang_bench(*settings(cfg), target, draft, {"s": prompts}, tmp_path / "out", RecordingReporter(),
                               server_cmd=STANDIN)
    metrics = run_grid(*settings(cfg), target, draft, prompts, rows, tmp_path / "out", RecordingReporter(),
                       server_cmd=STANDIN)
    grid = "bench/sglang/grid"
    for label in ("s2_k1_n3", "s3_k1_n4", "s3_k2_n4"):
        assert metrics[f"{grid}/{label}/tau"] == pytest.approx(2.5)
    assert not (tmp_path / "out" / "grid-s3_k1_n4.log").exists()  # serve.*'s own setting: the main bench's answers
    # the stand-in's cycle is 4 ms + steps x 1 ms: the fit finds the draft step, and with it the bound
    assert metrics[f"{grid}/draft_step_ms"] == pytest.approx(1.0, abs=0.6)
    assert metrics[f"{grid}/s2_k1_n3/speedup"] > metrics[f"{grid}/s3_k1_n4/speedup"]
    assert metrics["bench/sglang/grid_best/steps"] == 2.0
    assert 0 < metrics["bench/sglang/grid_best/speedup_of_bound"] <= 1.2
    assert "bench/sglang/grid/s3_k2_n4/speedup_bound" not in metrics  # a tree's steps cost what no chain shows
    best = dict(bench_rows(metrics))["SGLang best setting"]
    assert best.startswith("--speculative-algorithm EAGLE3 --speculative-num-steps 2 ") and "of the" in best
    saved = json.loads((tmp_path / "out" / "grid.json").read_text())
    assert saved["best_flags"].endswith("--speculative-num-steps 2 --speculative-eagle-topk 1 "
                                        "--speculative-num-draft-tokens 3")
    assert (tmp_path / "out" / "grid-s3_k2_n4.log").exists()


def test_server_gets_serve_env_and_this_process_does_not(tmp_path, monkeypatch):
    from draftlab.sglang.bench import server_env

    monkeypatch.setenv("PYTHONPATH", "/draftlab/site")
    cfg = config(env={"PYTHONPATH": "/sglang/site", "TRITON_CACHE_DIR": "/tmp/t"})
    env = server_env(cfg.serve)
    assert env["PYTHONPATH"] == "/sglang/site" and env["TRITON_CACHE_DIR"] == "/tmp/t"
    assert __import__("os").environ["PYTHONPATH"] == "/draftlab/site"


def test_failing_draft_is_never_launched(tmp_path):
    target = write_target(tmp_path / "t")
    draft = write_draft(tmp_path / "d", drop=("lm_head.weight",))
    with pytest.raises(DraftCheckError, match="lm_head.weight"):
        run_sglang_bench(*settings(config()), target, draft, {"s": [[1, 2]]}, tmp_path / "out", RecordingReporter(),
                         server_cmd=STANDIN)
    assert not (tmp_path / "out" / "speculative.log").exists()
    assert "lm_head.weight" in (tmp_path / "out" / "check-draft.txt").read_text()


def test_legacy_rules_refuse_layers0_names(tmp_path):
    target, draft = write_target(tmp_path / "t"), write_draft(tmp_path / "d")
    with pytest.raises(DraftCheckError, match="layers.0.self_attn.q_proj.weight"):
        run_sglang_bench(*settings(config(sglang_rules="legacy")), target, draft, {"s": [[1]]}, tmp_path / "out",
                         RecordingReporter(), server_cmd=STANDIN)


def test_speculators_draft_is_converted_then_benchmarked(tmp_path):
    target = write_target(tmp_path / "t")
    spec = convert(write_draft(tmp_path / "d"), tmp_path / "spec", "speculators")
    metrics, _ = run_sglang_bench(*settings(config()), target, spec, {"s": [[1, 2]]}, tmp_path / "out",
                                  RecordingReporter(), server_cmd=STANDIN)
    assert metrics["bench/sglang/s/tau"] > 2
    assert (tmp_path / "out" / "draft-sglang" / "config.json").exists()


def test_client_refuses_non_loopback_hosts():
    with pytest.raises(SGLangClientError, match="loopback"):
        SGLangClient("10.0.0.5", 30000)

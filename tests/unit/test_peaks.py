"""MFU two ways (issue 73): the datasheet peak is the standard denominator, the measured rate a second reading;
the peers' summary takes both from the card the run recorded."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import REPO
from draftlab.benchmarks.peaks import DATASHEET_TFLOPS, card, mfu_two_ways


def test_datasheet_peak_is_the_standard_denominator():
    assert DATASHEET_TFLOPS["H100"] == DATASHEET_TFLOPS["H200"] == 989.0
    # BENCHMARKS.md's restated rows: 43.0% of an H200's 790 measured is 34.3% of its datasheet peak
    h200 = mfu_two_ways(0.4298 * 790, "NVIDIA H200")
    assert h200["mfu_measured"] == pytest.approx(0.4298, abs=1e-4)
    assert h200["mfu"] == pytest.approx(0.3433, abs=1e-4)
    h100 = mfu_two_ways(0.55 * 790, "NVIDIA H100 80GB HBM3")
    assert h100["mfu"] == pytest.approx(0.4393, abs=1e-4)  # the peers' 55.0%: below the 50% goal
    assert h100["mfu_measured"] == pytest.approx(0.55 * 790 / 798, abs=1e-4)


def test_untabled_cards_get_no_mfu():
    assert card("NVIDIA H100 PCIe") is None and card(None) is None and card("NVIDIA A100-SXM4-80GB") is None
    assert mfu_two_ways(100.0, "NVIDIA A100-SXM4-80GB")["mfu"] is None


def test_peers_summary_reads_the_runs_card():
    spec = importlib.util.spec_from_file_location("peers_summary", REPO / "benchmarks" / "peers" / "summary.py")
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    assert summary.peaks_for("NVIDIA H100 80GB HBM3") == (989.0, 798.0)
    assert summary.peaks_for("NVIDIA H200") == (989.0, 790.0)
    assert summary.peaks_for("NVIDIA A100-SXM4-80GB", 312.0) == (312.0, None)


def test_train_throughput_reports_executed_against_required_flops():
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from train_throughput import flops_per_token, required_flops_per_token

    from draftlab.model.draft import DraftModelConfig

    cfg = DraftModelConfig(hidden_size=4, intermediate_size=8, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=2, target_hidden_size=4, draft_vocab_size=10, vocab_size=20)
    every, parts = flops_per_token(cfg, 8, 2)
    full = required_flops_per_token(cfg, 8, 2, 1.0, head_trained=True)
    assert every - full == pytest.approx(2 * parts["fc_params"])  # the features take no gradient
    half = required_flops_per_token(cfg, 8, 2, 0.5, head_trained=True)
    assert half < full and required_flops_per_token(cfg, 8, 2, 0.5, head_trained=False) < half

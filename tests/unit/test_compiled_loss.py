"""The soft cross-entropy under torch.compile (train.compile_loss, on by default on CUDA) equals the eager one:
value and gradient, in fp32 and from bf16 logits. Runs inductor's CPU backend; CUDA uses the same graph."""

from __future__ import annotations

import logging

import pytest
import torch

from draftlab.train import ttt
from draftlab.train.ttt import compiled_soft_ce_rows, soft_ce, soft_ce_for, soft_ce_rows


def _inputs(dtype: torch.dtype, rows: int = 37, vocab: int = 64):
    g = torch.Generator().manual_seed(0)
    lg = (4 * torch.randn(3, rows, vocab, generator=g)).to(dtype).requires_grad_(True)
    p = torch.randn(3, rows, vocab, generator=g).softmax(-1)
    w = torch.rand(3, rows, generator=g) > 0.3
    return lg, p, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_soft_ce_equals_eager(dtype):
    try:
        fused = compiled_soft_ce_rows()
        lg, p, w = _inputs(dtype)
        got = soft_ce(lg, p, w, fused)
    except torch._dynamo.exc.BackendCompilerFailed as error:  # no C++ compiler on this machine
        pytest.skip(f"inductor cannot build here: {error}")
    (got_grad,) = torch.autograd.grad(got, lg)
    lg2, p2, w2 = _inputs(dtype)
    want = soft_ce(lg2, p2, w2)
    (want_grad,) = torch.autograd.grad(want, lg2)
    assert got.dtype == torch.float32 and float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-5)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # a bf16 gradient is rounded to bf16 either way
    assert got_grad.dtype == dtype and torch.allclose(got_grad.float(), want_grad.float(), rtol=tol, atol=tol)
    # another shape reuses the dynamic graph rather than failing
    lg3, p3, w3 = _inputs(dtype, rows=11, vocab=64)
    assert float(soft_ce(lg3, p3, w3, fused).detach()) == pytest.approx(float(soft_ce(lg3, p3, w3).detach()), rel=1e-5)


def test_soft_ce_ignores_nan_rows_outside_the_mask():
    lg, p, w = _inputs(torch.float32)
    w[0, 0] = False
    with torch.no_grad():
        lg[0, 0] = float("nan")
    assert torch.isfinite(soft_ce(lg, p, w))


def test_compile_loss_choice(monkeypatch):
    built = []

    def fake_compiled():  # stands for torch.compile(soft_ce_rows): the same function, counted
        built.append(1)
        return _counted

    def _counted(lg, p):
        return soft_ce_rows(lg, p)

    monkeypatch.setattr(ttt, "compiled_soft_ce_rows", fake_compiled)
    cpu = torch.device("cpu")
    assert soft_ce_for("auto", cpu, torch.float32) is soft_ce_rows
    assert soft_ce_for("false", cpu, torch.float32) is soft_ce_rows
    assert built == []  # not built, not probed
    assert soft_ce_for("True", cpu, torch.bfloat16) is _counted and built == [1]  # a YAML true, probed in bf16
    with pytest.raises(ValueError, match="train.compile_loss"):
        soft_ce_for("sometimes", cpu, torch.float32)


def test_a_loss_that_cannot_be_compiled_falls_back_before_training(monkeypatch, caplog):
    """A machine where torch.compile cannot build the loss (no Triton, say) trains with the eager one, and says so."""

    def broken(lg, p):
        raise RuntimeError("Cannot find a working triton installation")  # what torch says without Triton

    monkeypatch.setattr(ttt, "compiled_soft_ce_rows", lambda: broken)
    with caplog.at_level(logging.WARNING, logger="draftlab"):
        assert soft_ce_for("true", torch.device("cpu"), torch.float32) is soft_ce_rows
    assert "torch.compile of the loss failed" in caplog.text and "triton" in caplog.text


def test_the_real_compiled_loss_passes_the_probe():
    fused = soft_ce_for("true", torch.device("cpu"), torch.float32)
    if fused is soft_ce_rows:
        pytest.skip("inductor cannot build on this machine (see the warning)")
    assert fused is compiled_soft_ce_rows()

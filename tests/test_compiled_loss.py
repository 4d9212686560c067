"""The soft cross-entropy under torch.compile (train.compile_loss, on by default on CUDA) equals the eager one:
value and gradient, in fp32 and from bf16 logits. Runs inductor's CPU backend; CUDA uses the same graph."""

from __future__ import annotations

import logging

import pytest
import torch

from draftlab.train import loop
from draftlab.train.loop import soft_ce_for
from draftlab.train.ttt import compiled_soft_ce, soft_ce


def _inputs(dtype: torch.dtype, rows: int = 37, vocab: int = 64):
    g = torch.Generator().manual_seed(0)
    lg = (4 * torch.randn(3, rows, vocab, generator=g)).to(dtype).requires_grad_(True)
    p = torch.randn(3, rows, vocab, generator=g).softmax(-1)
    w = torch.rand(3, rows, generator=g) > 0.3
    return lg, p, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_soft_ce_equals_eager(dtype):
    try:
        fused = compiled_soft_ce()
        lg, p, w = _inputs(dtype)
        got = fused(lg, p, w)
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
    assert float(fused(lg3, p3, w3).detach()) == pytest.approx(float(soft_ce(lg3, p3, w3).detach()), rel=1e-5)


def test_soft_ce_ignores_nan_rows_outside_the_mask():
    lg, p, w = _inputs(torch.float32)
    w = w.clone()
    w[0, 0] = False
    with torch.no_grad():
        lg[0, 0] = float("nan")
    assert torch.isfinite(soft_ce(lg, p, w))


def test_compile_loss_choice():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert soft_ce_for("auto", cpu) is soft_ce and soft_ce_for("false", cuda) is soft_ce
    assert soft_ce_for("auto", cuda) is compiled_soft_ce() and soft_ce_for("True", cpu) is compiled_soft_ce()
    with pytest.raises(ValueError, match="train.compile_loss"):
        soft_ce_for("sometimes", cpu)


def test_trainer_falls_back_to_the_eager_loss_when_compile_fails(monkeypatch, caplog):
    """A machine where torch.compile cannot build the loss still trains, and says so."""

    def broken(lg, p, w):
        raise torch._dynamo.exc.TorchDynamoException("no triton")

    def fake_unroll(self, batch):  # stands for the unroll: it calls whichever loss the trainer holds
        used.append(self.ce)
        return self.ce(*batch)

    used = []
    trainer = loop.Trainer.__new__(loop.Trainer)
    trainer.ce = broken
    monkeypatch.setattr(loop.Trainer, "_unroll", fake_unroll)
    lg, p, w = _inputs(torch.float32)
    with caplog.at_level(logging.WARNING, logger="draftlab"):
        got = trainer._forward((lg, p, w))
    assert used == [broken, soft_ce] and trainer.ce is soft_ce
    assert float(got.detach()) == pytest.approx(float(soft_ce(lg, p, w).detach()))
    assert "torch.compile of the loss failed" in caplog.text
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):  # the eager loss failing is not swallowed
        monkeypatch.setattr(loop, "soft_ce", broken)
        trainer.ce = broken
        trainer._forward((lg, p, w))

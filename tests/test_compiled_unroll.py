"""The packed unroll under torch.compile (train.compile_unroll, on by default on CUDA) equals the eager one: loss,
every gradient and every stat, in fp32, on inductor's CPU backend (CUDA compiles the same graph with Triton). One
dynamic-shape graph serves batches of other sizes, and a machine that cannot compile trains eagerly and says so."""

from __future__ import annotations

import logging

import pytest
import torch

from draftlab.train import compiled_unroll
from draftlab.train.compiled_unroll import CompiledUnroll, unroll_core_for
from draftlab.train.packed import PackedPlan, packed_unroll

from test_packed_unroll import _batch, _run
from test_ttt import _model

STEPS = 2


def _cropped(batch: dict, rows: int, length: int) -> dict:
    """Another batch shape from the same data: fewer rows and positions (contiguous, as a batch read from shards)."""
    return {k: v[:rows, :length].contiguous() for k, v in batch.items()}


def _unroll(model, batch, lm_head, core=None):
    plan = PackedPlan.of(batch["loss_mask"], batch["attention_mask"], STEPS)
    return lambda: packed_unroll(model, batch, lm_head, STEPS, 0.8, plan=plan, core=core)


def test_compiled_unroll_equals_eager_and_keeps_one_graph_across_shapes(caplog):
    model = _model()
    batch, lm_head = _batch()
    core = CompiledUnroll()
    graphs = compiled_unroll._graphs()
    with caplog.at_level(logging.INFO, logger="draftlab"):
        try:
            got = _run(_unroll(model, batch, lm_head, core), model)
        except torch._dynamo.exc.BackendCompilerFailed as error:  # no C++ compiler on this machine
            pytest.skip(f"inductor cannot build here: {error}")
    assert core.failed is None and compiled_unroll._graphs() == graphs + 1
    assert "compiled the unroll in" in caplog.text
    for b in (batch, _cropped(batch, 3, 12)):  # the second shape must reuse the first graph
        loss_c, stats_c, grads_c = got if b is batch else _run(_unroll(model, b, lm_head, core), model)
        loss_e, stats_e, grads_e = _run(_unroll(model, b, lm_head), model)
        assert float(loss_c) == pytest.approx(float(loss_e), rel=1e-5)
        assert torch.allclose(stats_c, stats_e, rtol=1e-5, atol=1e-4), (stats_e, stats_c)
        assert grads_c.keys() == grads_e.keys() and "fc.weight" in grads_c
        for name in grads_e:
            assert torch.allclose(grads_c[name], grads_e[name], rtol=1e-4, atol=1e-6), name
    assert compiled_unroll._graphs() == graphs + 1, "a new batch shape recompiled the unroll"


class _Unbuildable:
    def __call__(self, *args):
        raise torch._dynamo.exc.TorchDynamoException("Cannot find a working triton installation")


def test_an_unroll_that_cannot_be_compiled_trains_eagerly(caplog):
    model = _model()
    batch, lm_head = _batch()
    core = CompiledUnroll()
    core._compiled = _Unbuildable()  # what torch.compile raises where it cannot build (no Triton, no compiler)
    with caplog.at_level(logging.WARNING, logger="draftlab"):
        loss_f, stats_f, grads_f = _run(_unroll(model, batch, lm_head, core), model)
        _run(_unroll(model, batch, lm_head, core), model)  # not tried again, not warned again
    loss_e, stats_e, grads_e = _run(_unroll(model, batch, lm_head), model)
    assert isinstance(core.failed, torch._dynamo.exc.TorchDynamoException)
    assert caplog.text.count("torch.compile of the unroll failed") == 1 and "triton" in caplog.text
    assert torch.equal(loss_f, loss_e) and torch.equal(stats_f, stats_e)
    assert all(torch.equal(grads_f[n], grads_e[n]) for n in grads_e)


def test_compile_unroll_choice():
    cpu = torch.device("cpu")
    assert unroll_core_for("auto", cpu) is None and unroll_core_for("false", cpu) is None
    assert isinstance(unroll_core_for("True", cpu), CompiledUnroll)  # a YAML true; built lazily, at the first batch
    assert isinstance(unroll_core_for("auto", torch.device("cuda")), CompiledUnroll)
    with pytest.raises(ValueError, match="train.compile_unroll"):
        unroll_core_for("sometimes", cpu)

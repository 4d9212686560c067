"""The packed unroll under torch.compile (train.compile_unroll, on by default on CUDA) equals the eager one: loss,
every gradient and every stat, in fp32, on inductor's CPU backend (CUDA compiles the same graph with Triton). One
dynamic-shape graph serves batches of other sizes, and a machine that cannot compile trains eagerly and says so."""

from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from draftlab.train.compiled_unroll import CompiledUnroll, unroll_core_for
from draftlab.train.device_batch import attach_plan, to_device
from draftlab.train import packed
from draftlab.train.packed import PackedPlan, packed_unroll

from test_packed_unroll import _batch, _run
from test_ttt import _model

STEPS = 2


def _cropped(batch: dict, rows: int, length: int) -> dict:
    """Another batch shape from the same data: fewer rows and positions (contiguous, as a batch read from shards)."""
    return {k: v[:rows, :length].contiguous() for k, v in batch.items()}


def _tiled(batch: dict, times: int) -> dict:
    """The batch's rows `times` over."""
    return {k: v.repeat(times, *[1] * (v.dim() - 1)) for k, v in batch.items()}


def _unroll(model, batch, lm_head, core=None, **padding):
    """The unroll as the trainer runs it: the batch padded to a multiple of 8 positions (or `padding`, attach_plan's
    keywords), with its plan."""
    on_device, plan = to_device(attach_plan(batch, STEPS, **(padding or {"multiple": 8})), torch.device("cpu"), STEPS)
    return lambda: packed_unroll(model, on_device, lm_head, STEPS, 0.8, plan=plan, core=core)


def _assert_close(compiled, eager) -> None:
    """(loss, stats, grads) of the compiled unroll against the eager one's, to fp32 compile tolerance."""
    (loss_c, stats_c, grads_c), (loss_e, stats_e, grads_e) = compiled, eager
    assert float(loss_c) == pytest.approx(float(loss_e), rel=1e-5)
    assert torch.allclose(stats_c, stats_e, rtol=1e-5, atol=1e-4), (stats_e, stats_c)
    assert grads_c.keys() == grads_e.keys()
    for name in grads_e:
        assert torch.allclose(grads_c[name], grads_e[name], rtol=1e-4, atol=1e-6), name


def test_compiled_unroll_equals_eager_and_keeps_one_graph_across_shapes(caplog, monkeypatch):
    # a guard: chunks of 8 teacher rows, so that the shapes below would have different chunk counts if the compiled
    # path (pools with target_top: one matmul, ttt.teacher_logits) chunked again; each count would be a graph
    monkeypatch.setattr(packed, "TEACHER_CHUNK", 8)
    model = _model()
    batch, lm_head = _batch()  # 4 rows of 15 positions (padded to 16)
    core = CompiledUnroll()
    aot = counters["aot_autograd"]
    before = {key: aot[key] for key in ("total", "autograd_cache_bypass")}
    with caplog.at_level(logging.INFO, logger="draftlab"):
        got = _run(_unroll(model, batch, lm_head, core), model)
    if core.failed is not None:  # no C++ compiler on this machine: it trained eagerly and said so
        pytest.skip(f"inductor cannot build here: {core.failed}")
    assert core.graphs == 1 and "compiled the unroll for training in" in caplog.text and "(graph 1" in caplog.text
    # the build's seconds by phase, from torch.compile's own timers (a compile or a cache hit, whichever this machine's
    # cache gives): each phase measured, modules a part of the backend, and together never more than the call took
    phases = {key: value for key, value in core.metrics().items() if key.startswith("train/compile_")}
    trace, backend = phases["train/compile_trace_s"], phases["train/compile_backend_s"]
    assert trace > 0 and backend > 0 and 0 < phases["train/compile_modules_s"] <= backend
    assert trace + backend + phases["train/compile_guards_s"] <= phases["train/compile_s"] + 0.05, phases
    assert "Dynamo's trace" in caplog.text
    # traced once (a float traced as a symbol made dynamo start over) and storable in AOTAutograd's cache (an
    # inference_mode switch in the graph was not): what a second process finds warm
    assert aot["total"] - before["total"] == 1 and aot["autograd_cache_bypass"] == before["autograd_cache_bypass"]
    # other rows, lengths (to 8 and 16 positions) and teacher row counts reuse that graph. (Inductor's CPU code
    # has a guard of its own: a float sum over more than 4,096 elements, here the pairs of all steps, takes another
    # graph; the tiled batch stays below it.)
    shapes = [batch, _cropped(batch, 3, 7), _tiled(batch, 40)]
    for b in shapes:
        compiled = got if b is batch else _run(_unroll(model, b, lm_head, core), model)
        _assert_close(compiled, _run(_unroll(model, b, lm_head), model))
        assert "fc.weight" in compiled[2]
    chunks = {-(-len(PackedPlan.of(b["loss_mask"], b["attention_mask"], STEPS).needed) // 8) for b in shapes}
    assert len(chunks) == 3, chunks
    assert core.graphs == 1, "a new batch shape recompiled the unroll"
    # padded to buckets as for CUDA graphs (train.compile_cuda_graphs: filler rows, kept rows and pairs): the same
    # graph, the batch's own numbers
    bucketed = _run(_unroll(model, batch, lm_head, core, multiple=8, rows=8, counts=20), model)
    _assert_close(bucketed, _run(_unroll(model, batch, lm_head), model))
    assert core.graphs == 1, "a batch padded to buckets recompiled the unroll"
    # a one-row batch (sizes 0 and 1 are specialised even in a dynamic graph) runs eager instead of recompiling
    one_row = _cropped(batch, 1, 15)
    loss_c, _, grads_c = _run(_unroll(model, one_row, lm_head, core), model)
    loss_e, _, grads_e = _run(_unroll(model, one_row, lm_head), model)
    assert float(loss_c) == float(loss_e) and all(torch.equal(grads_c[n], grads_e[n]) for n in grads_e)
    assert core.graphs == 1, "a one-row batch recompiled the unroll"
    assert "recompile" not in caplog.text


@pytest.mark.parametrize("amp", [False, True])
def test_the_one_pass_loss_equals_the_eager_step_by_step_one(amp):
    # compiled, the loss runs once over every step's pairs (packed._pair_ce); eager, step by step. With filler pairs
    # (a batch padded to buckets), the data-parallel denominators and the trainer's bf16 autocast: the same loss
    # and stats, gradients to bf16's rounding of another summation order. aot_eager: the traced graph, no codegen
    model = _model()
    batch, lm_head = _batch()
    on_device, plan = to_device(attach_plan(batch, STEPS, multiple=8, rows=8, counts=20), torch.device("cpu"), STEPS)
    assert not plan.real.all()  # filler pairs, which count for nothing

    def unroll(core):
        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                return packed_unroll(model, on_device, lm_head, STEPS, 0.8, loss_norm=torch.tensor([50.0, 40.0]),
                                     plan=plan, core=core)
        return run

    core = CompiledUnroll(backend="aot_eager")
    (loss_c, stats_c, grads_c), (loss_e, stats_e, grads_e) = _run(unroll(core), model), _run(unroll(None), model)
    assert core.failed is None and core.graphs == 1
    assert float(loss_c) == pytest.approx(float(loss_e), rel=1e-5) and torch.allclose(stats_c, stats_e, atol=1e-6)
    assert grads_c.keys() == grads_e.keys()
    for name in grads_e:
        tol = {"rtol": 2e-2, "atol": 1e-3} if amp else {"rtol": 1e-4, "atol": 1e-6}
        assert torch.allclose(grads_c[name], grads_e[name], **tol), name


def test_the_cpp_wrapper_launches_the_same_graph_from_cpp():
    # train.compile_cpp_wrapper: Inductor's wrapper in C++ (less host time a launch on the GPU), the same results
    model = _model()
    batch, lm_head = _batch()
    core = unroll_core_for("true", torch.device("cpu"), cpp_wrapper=True)
    got, wrappers = run_and_get_code(lambda: _run(_unroll(model, batch, lm_head, core), model))
    if core.failed is not None:
        pytest.skip(f"inductor cannot build here: {core.failed}")
    assert core.graphs == 1 and wrappers and all("CppWrapperCodeCache" in code for code in wrappers)
    _assert_close(got, _run(_unroll(model, batch, lm_head), model))


def test_the_trainer_feeds_its_compiled_unroll_padded_batches(tmp_path, monkeypatch):
    """The trainer hands its batches to the compiled unroll padded to a multiple of 8 (training and validation), and
    batches of other sizes reuse one graph each (`aot_eager`: the capture without inductor's codegen)."""
    from draftlab.util.reporting import RecordingReporter
    from draftlab.train import loop
    from test_train_loop import FakeSource, _settings
    from test_train_loop import _model as source_model

    class WithTop(FakeSource):  # batches with the target's top-1, as shards extracted today have
        def _batches(self, *args):
            for b in super()._batches(*args):
                top = (b["last_hidden"].float() @ self.lm_head.T).argmax(-1).to(torch.int32)
                yield dict(b, target_top=top)

    seen = []

    class Recording(CompiledUnroll):
        def __call__(self, model, batch, *rest):
            seen.append((tuple(batch["input_ids"].shape), torch.is_grad_enabled()))
            return super().__call__(model, batch, *rest)

    torch._dynamo.reset()  # dynamo keeps graphs per function, across cores: an earlier test's would serve these
    monkeypatch.setattr(loop, "unroll_core_for",
                        lambda *args: Recording(backend="aot_eager", validation=True))
    source = WithTop()
    trainer = loop.Trainer(source_model(source), source, source.lm_head, _settings(epochs=1), tmp_path,
                           RecordingReporter())
    trainer.run()
    assert trainer.padding == {"multiple": 8} and trainer.core.failed is None
    assert trainer.core.graphs == 2 and trainer.core.built == {"training": 1, "validation": 1}
    assert {grad for _, grad in seen} == {True, False} and all(shape[1] % 8 == 0 for shape, _ in seen)
    assert len({shape for shape, grad in seen if grad}) > 1  # training batches of several shapes: still one graph


def test_validation_compiles_a_graph_of_its_own_and_never_a_second():
    torch._dynamo.reset()  # dynamo keeps graphs per function, across cores: an earlier test's would serve these
    model = _model()
    batch, lm_head = _batch()
    # the capture alone (the stance is dynamo's, not inductor's); validation compiled whatever the cache holds
    core = CompiledUnroll(backend="aot_eager", validation=True)

    def evaluate(b, steps=STEPS, with_core=True):
        on_device, plan = to_device(attach_plan(b, steps, 8), torch.device("cpu"), steps)
        with torch.no_grad():
            return packed_unroll(model, on_device, lm_head, steps, 0.8, plan=plan, core=core if with_core else None)

    model.eval()
    for b in (batch, _cropped(batch, 3, 7)):  # one graph for both shapes, the eager numbers
        core.built["validation"] = 0  # as if first: no eager_on_recompile, so another graph would be built here
        (loss_c, stats_c), (loss_e, stats_e) = evaluate(b), evaluate(b, with_core=False)
        assert float(loss_c) == pytest.approx(float(loss_e), rel=1e-6) and torch.allclose(stats_c, stats_e)
    assert core.graphs == 1
    core.built["validation"] = 1
    # a batch the graph's guards refuse (here another TTT depth, a constant of the graph) runs eager, not compiled
    (loss_c, stats_c), (loss_e, stats_e) = evaluate(batch, steps=3), evaluate(batch, steps=3, with_core=False)
    assert torch.equal(loss_c, loss_e) and torch.equal(stats_c, stats_e) and core.graphs == 1
    model.train()
    _run(_unroll(model, batch, lm_head, core), model)  # training's graph is its own
    assert core.built == {"training": 1, "validation": 1}


def test_validation_is_compiled_once_the_cache_is_warm():
    """auto: validation's compile would be on the critical path unless the cache is warm, which training's graph tells
    (loaded from the cache, or not)."""
    torch._dynamo.reset()
    model = _model()
    batch, lm_head = _batch()
    core = CompiledUnroll(backend="aot_eager")  # aot_eager stores nothing: training's graph is built cold
    _run(_unroll(model, batch, lm_head, core), model)
    with torch.no_grad():
        _unroll(model, batch, lm_head, core)()
    assert core.built == {"training": 1, "validation": 0}  # validation ran eager
    core.hits["training"] = 1  # as the warm-up's cache gives it
    with torch.no_grad():
        _unroll(model, batch, lm_head, core)()
    assert core.built == {"training": 1, "validation": 1}


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

"""The bench engine's CUDA graph path, checked on the CPU (serve/cuda_graphs.py, modes.py): which mode a config
and a target select, that a failed or empty capture falls back to eager steps, and that the fixed-shape steps a
graph would capture neither read device values on the host nor bake in a value that changes with the position.
Their numbers (static cache against dynamic) are tested in test_engine_static.py; the capture itself runs on
the GPU in `python -m draftlab benchmark spec_decode_gpu`.
"""

from __future__ import annotations

import logging

import pytest
import torch
from test_engine import K, eagle3_folder, references, target  # noqa: F401
from fake_cuda import Dispatched, FakeCuda


from draftlab.serve import static_target
from draftlab.serve.cuda_graphs import StepGraph, graphs_enabled
from draftlab.serve.engine import SpecEngine
from draftlab.serve.modes import DYNAMIC, STATIC, engine_mode, load_drafter
from draftlab.serve.static_target import StaticTargetRunner


# --- mode selection and the CUDA graph fallback -----------------------------------------------------------


def test_graph_settings():
    cpu = torch.device("cpu")
    assert graphs_enabled("auto", cpu) is False and graphs_enabled("false", cpu) is False
    assert graphs_enabled("auto", torch.device("cuda")) is True
    with pytest.raises(ValueError, match="bench.cuda_graphs: true needs a CUDA target"):
        graphs_enabled(True, cpu)
    with pytest.raises(ValueError, match="bench.cuda_graphs: 'sometimes'"):
        graphs_enabled("sometimes", cpu)
    assert engine_mode(True, "auto", cpu) == STATIC and engine_mode(False, "false", cpu) == DYNAMIC
    assert engine_mode(False, "auto", torch.device("cuda")) == DYNAMIC  # auto graphs need the static cache
    with pytest.raises(ValueError, match="bench.cuda_graphs: true needs fixed shapes"):
        engine_mode(False, "true", torch.device("cuda"))
    split = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).to("meta"))  # two devices
    assert engine_mode(True, "auto", cpu, split) == DYNAMIC
    assert engine_mode(True, "auto", cpu, torch.nn.Linear(2, 2)) == STATIC
    from transformers import MistralConfig

    sliding = torch.nn.Linear(2, 2)
    sliding.config = MistralConfig(sliding_window=16)  # our mask would ignore the window: keep the dynamic cache
    assert engine_mode(True, "auto", cpu, sliding) == DYNAMIC
    with pytest.raises(ValueError, match="bench.cuda_graphs: true needs the static KV cache"):
        engine_mode(True, "true", torch.device("cuda"), sliding)
    flash = torch.nn.Linear(2, 2)  # StaticTargetRunner refuses it: the bench must fall back, not fail
    flash.config = MistralConfig(sliding_window=None)
    flash.config._attn_implementation = "flash_attention_2"
    assert engine_mode(True, "auto", torch.device("cuda"), flash) == DYNAMIC
    with pytest.raises(ValueError, match="attention is flash_attention_2"):
        engine_mode(True, "true", torch.device("cuda"), flash)
    flash.config._attn_implementation = "sdpa"
    assert engine_mode(True, "auto", cpu, flash) == STATIC


def test_failed_capture_falls_back_to_eager(caplog):
    """Where capture fails (here: no CUDA at all), the step logs why once and runs eagerly, with eager results."""
    calls = []

    def fn():
        calls.append(1)
        return (torch.full((2,), float(len(calls))),)

    step = StepGraph(fn, "test step", enabled=True)
    with caplog.at_level(logging.WARNING, logger="draftlab.serve"):
        first = step()
        second = step()
    assert not step.captured and not step.enabled and step.failure
    assert first[0].tolist() == [float(len(calls) - 1)] * 2 and second[0].tolist() == [float(len(calls))] * 2
    assert sum("CUDA graph for test step not used" in r.message for r in caplog.records) == 1


def test_failed_capture_leaves_later_steps_on_the_callers_stream(monkeypatch):
    """torch.cuda.graph's exit raises before it restores the stream when a capture fails: the fallback must put the
    caller's stream back, else every later eager step (and other capture) runs on the capture stream."""
    fake = FakeCuda(monkeypatch)

    def fn():
        if fake.current == "capture":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")  # an .item()
        return (torch.ones(2),)

    step = StepGraph(fn, "syncing step", enabled=True)
    assert step()[0].tolist() == [1.0, 1.0] and not step.captured and "during capture" in step.failure
    assert torch.cuda.current_stream() == "default"
    # torch may leave its allocator routing into the failed capture's pool: no later step tries to capture
    later = StepGraph(lambda: (torch.zeros(1),), "later step", enabled=True)
    assert later()[0].tolist() == [0.0] and not later.captured and "an earlier capture" in later.failure


def test_a_graph_that_replays_nothing_is_refused(monkeypatch):
    """A capture on another device than fn's tensors records nothing (its kernels run eagerly, outside the graph),
    and the replay of that empty graph leaves the outputs as the capture's eager run left them: equal to the
    warm-up's, so a plain comparison passes and every later call returns stale numbers. The check must see it."""
    FakeCuda(monkeypatch)
    x = torch.ones(())

    step = StepGraph(lambda: (x * torch.ones(2),), "empty graph", enabled=True)
    assert step()[0].tolist() == [1.0, 1.0]
    assert not step.captured and "replay differs" in step.failure
    x.fill_(3.0)
    assert step()[0].tolist() == [3.0, 3.0]


def test_a_step_that_moves_its_state_on_runs_once_per_call(monkeypatch):
    """A whole speculative cycle advances its positions (serve/sync_free.py): the capture's warm-up runs, its
    eager capture body here and the fallback must leave the state as one run leaves it."""
    FakeCuda(monkeypatch)
    position, out = torch.zeros((), dtype=torch.long), torch.zeros(2)

    def cycle():
        position.add_(1)
        return (out + position,)

    step = StepGraph(cycle, "cycle", enabled=True, state=(position,))
    assert step()[0].tolist() == [1.0, 1.0] and position.item() == 1  # the fake replays nothing: eager from here
    assert step()[0].tolist() == [2.0, 2.0] and position.item() == 2


# ops that copy a device value to the host (.item(), int(), float(), bool(): `item`, or `_local_scalar_dense`
# outside inference mode; `is_nonzero`, `equal`) or size their result by the data (`nonzero`, ...). tolist() reads
# memory without an op, so it is not seen; none of the step code calls it.
HOST_READS = {"item", "_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "unique",
              "_unique2", "unique_consecutive", "unique_dim", "repeat_interleave"}


def HostReads() -> Dispatched:
    """Records the host-reading ops run under it (`seen`)."""
    return Dispatched(frozenset(HOST_READS))


def _fixed_shape_steps(target, references, folder):
    drafter, _ = load_drafter(folder, target.model, STATIC)
    runner = StaticTargetRunner(target.model, drafter.feature_layers)
    SpecEngine(target.model, drafter, K, [], runner=runner).generate(references[0][0], 6)  # buffers as in use
    block, steps = torch.zeros(K + 1, dtype=torch.long), torch.arange(K + 1)
    return {"target verify": lambda: runner._run(block, static_target._slots(runner._base, steps), True, False),
            "target decode": lambda: runner._run(block[:1], static_target._slots(runner._base, steps[:1]), False,
                                                 False),
            "draft extend": drafter._extend_step(K + 1)[0].fn,
            "draft chain": lambda: drafter._chain(K, 0.0, None)[:1]}, runner, drafter


def test_fixed_shape_steps_never_read_device_values_on_the_host(target, references, eagle3_folder, monkeypatch):
    """A CUDA graph freezes every host decision made at capture, and a host read inside a capture fails it. So
    each fixed-shape step (what bench.cuda_graphs captures) must run without one; checked on the CPU by recording
    the ops that read device values on the host. The recorder is checked too: an .item() in the slots is seen."""
    steps, _, _ = _fixed_shape_steps(target, references, eagle3_folder)
    with torch.inference_mode():
        for name, fn in steps.items():
            with HostReads() as reads:
                fn()
            assert reads.seen == [], f"{name} reads device values on the host: {reads.seen}"
        monkeypatch.setattr(static_target, "_slots", lambda base, steps: base + steps + int(steps.sum().item()) * 0)
        with HostReads() as reads:
            steps["target verify"]()
        assert reads.seen and set(reads.seen) <= {"item", "_local_scalar_dense"}


def _calls_at(steps, runner, drafter, position: int) -> dict[str, list]:
    """Each fixed-shape step's dispatched calls with the request at `position` (host lengths and device bases)."""
    runner.length = drafter.length = position
    runner._base.fill_(position)
    drafter._base.fill_(position)
    seen = {}
    with torch.inference_mode():
        for name, fn in steps.items():
            with Dispatched() as calls:
                fn()
            seen[name] = calls.calls
    return seen



def test_graph_steps_bake_in_no_value_that_changes_with_the_position(target, references, eagle3_folder,
                                                                    monkeypatch):
    """A replayed graph repeats its captured kernels with their captured scalars and shapes, so what a fixed-shape
    step dispatches under graphs (every slot attended) must not depend on where the request is. The eager span
    (used slots only) does depend on it, which shows that the check can fail."""
    from draftlab.serve.static_drafter import StaticEagle3Drafter

    steps, runner, drafter = _fixed_shape_steps(target, references, eagle3_folder)
    monkeypatch.setattr(StaticEagle3Drafter, "_span", lambda self, used: None)  # what graphs=True gives
    assert _calls_at(steps, runner, drafter, 7) == _calls_at(steps, runner, drafter, 19)
    monkeypatch.undo()
    assert _calls_at(steps, runner, drafter, 7)["draft extend"] != _calls_at(steps, runner, drafter, 19)["draft extend"]

"""The static-KV-cache engine (serve/static_target.py, static_drafter.py, draft_cache.py) is lossless in fp32 and
computes what the dynamic one computes.

- Greedy output equals the target's own greedy output with right, wrong and random drafts, with EOS and length
  limits inside a drafted block, and with one engine reused across prompts (stale slots of an earlier request
  must stay invisible).
- A static target step gives the dynamic step's logits and features, through prefills, verify blocks and
  rollbacks; the static EAGLE-3 drafter proposes what the dynamic one proposes.
- The checks can fail: an off-by-one in the slot position, in the rollback, or in the draft's visibility mask
  is caught (mutation tests below).
On the CPU the fixed-shape steps run eagerly; the CUDA graph path is the same step code, captured
(serve/cuda_graphs.py; its fallback is tested here, its capture on the GPU by bench/h200_engine.sh).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from test_engine import (K, MAX_NEW, V_SMALL, BigramDrafter, ScriptDrafter, _chi2_pvalue, _exact_joint,
                         eagle3_folder, references, sharp_folder, small_model, target)  # noqa: F401
from fake_cuda import FakeCuda

from torch.utils._python_dispatch import TorchDispatchMode

from draftlab.serve import draft_cache, static_target
from draftlab.serve import engine as eng
from draftlab.serve.cuda_graphs import StepGraph, graphs_enabled
from draftlab.serve.engine import SpecEngine, TargetRunner, target_decode
from draftlab.serve.modes import DYNAMIC, STATIC, engine_mode, load_drafter
from draftlab.serve.static_target import StaticTargetRunner


@pytest.fixture(params=["used", "full"])
def span(request, monkeypatch):
    """Eager steps attend over the used slots only; a CUDA graph attends over all of them (stale and padding
    slots masked). "full" runs the graphs' computation eagerly, so the CPU checks what the GPU replays."""
    if request.param == "full":
        from draftlab.serve.static_drafter import StaticEagle3Drafter

        monkeypatch.setattr(StaticTargetRunner, "_span", lambda self, count: None)
        monkeypatch.setattr(StaticEagle3Drafter, "_span", lambda self, used: None)
    return request.param


def _static_engine(target, drafter, k=K):
    runner = StaticTargetRunner(target.model, getattr(drafter, "feature_layers", ()))
    return SpecEngine(target.model, drafter, k, eos_token_ids=[], runner=runner)


@pytest.mark.parametrize("mode", ["right", "wrong", "random"])
def test_static_greedy_is_lossless(target, references, mode, span):
    engine = _static_engine(target, ScriptDrafter([], mode, target.vocab_size))  # one engine, every prompt
    accepted = set()
    for n, (ids, ref) in enumerate(references):
        engine.drafter = ScriptDrafter(ref, mode, target.vocab_size, seed=n)
        got = engine.generate(ids, MAX_NEW)
        assert got.tokens == ref[:MAX_NEW], f"prompt {n}"
        assert sum(got.committed) + 1 == MAX_NEW
        accepted.update(got.accepted)
    assert len(accepted) >= (3 if mode == "random" else 1)


@pytest.mark.parametrize("mode", ["right", "random", "wrong"])
def test_static_eos_and_length_inside_a_drafted_block(target, references, mode, span):
    engine = _static_engine(target, ScriptDrafter([], mode, target.vocab_size))
    for n, (ids, ref) in enumerate(references[:4]):
        for eos_at in (0, 3, 6):
            engine.eos = {ref[eos_at]}
            engine.drafter = ScriptDrafter(ref, mode, target.vocab_size, seed=eos_at)
            got = engine.generate(ids, MAX_NEW)
            assert got.tokens == ref[: ref.index(ref[eos_at]) + 1] and got.stop == "eos"
    engine.eos = set()
    ids, ref = references[1]
    for max_new in range(1, 2 * K + 4):
        engine.drafter = ScriptDrafter(ref, mode, target.vocab_size, seed=max_new)
        got = engine.generate(ids, max_new)
        assert got.tokens == ref[:max_new] and got.stop == "length"


def test_static_target_decode_equals_generate(target, references):
    runner = StaticTargetRunner(target.model)
    for ids, ref in references[:3]:
        assert target_decode(target.model, ids, MAX_NEW, [], runner=runner).tokens == ref[:MAX_NEW]


def _step_trace(runner, ids, blocks):
    """Prefill, then verify blocks of K+1 tokens, each followed by a rollback keeping `keep` of them."""
    out = []
    runner.reserve(len(ids) + 64)
    runner.reset()
    out.append(runner.forward(torch.tensor(ids), True, last_only=True))
    for block, keep in blocks:
        before = runner.length
        out.append(runner.forward(torch.tensor(block), True))
        runner.crop(before + keep)
    return out


def _compare_steps(target, references):
    ids, ref = references[0]
    blocks = [(ref[i: i + K + 1], keep) for i, keep in zip(range(0, 4 * K, 2), (1, 3, 2, 5, 1, 4, 2, 3))]
    layers = (1, 3, 4)
    dynamic = _step_trace(TargetRunner(target.model, layers), ids, blocks)
    static = _step_trace(StaticTargetRunner(target.model, layers), ids, blocks)
    for (dl, df), (sl, sf) in zip(dynamic, static):
        torch.testing.assert_close(sl, dl, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(sf, df, atol=1e-5, rtol=1e-5)


def test_static_step_gives_the_dynamic_logits_and_features(target, references, span):
    _compare_steps(target, references)


@pytest.mark.parametrize("shift", [1, -1])
def test_off_by_one_slot_is_caught(target, references, monkeypatch, shift, span):
    """Writing a step's keys one slot off (positions and mask with it) changes its logits: the test sees it."""
    monkeypatch.setattr(static_target, "_slots", lambda base, steps: (base + steps + shift).clamp_min(0))
    with pytest.raises(AssertionError):
        _compare_steps(target, references)


@pytest.mark.parametrize("shift", [1, -1])
def test_off_by_one_rollback_is_caught_with_a_static_cache(target, references, monkeypatch, shift):
    monkeypatch.setattr(eng, "_rollback_length", lambda before, m: min(before + m + 1 + shift, before + K + 1))
    engine = _static_engine(target, ScriptDrafter([], "wrong", target.vocab_size))
    mismatched = 0
    for n, (ids, ref) in enumerate(references):
        engine.drafter = ScriptDrafter(ref, "random", target.vocab_size, seed=n)
        mismatched += engine.generate(ids, MAX_NEW).tokens != ref[:MAX_NEW]
    assert mismatched >= 2, "an off-by-one rollback went unnoticed"


def test_cache_grows_for_a_longer_request(target, references):
    ids, _ = references[0]
    runner = StaticTargetRunner(target.model, max_len=1)
    small = runner.max_len
    long_ref = target.model.generate(torch.tensor([ids]), max_new_tokens=small, do_sample=False,
                                     eos_token_id=None, min_new_tokens=small)[0, len(ids):].tolist()
    got = target_decode(target.model, ids, small, [], runner=runner)
    assert runner.max_len > small and got.tokens == long_ref


# --- the static EAGLE-3 drafter -------------------------------------------------------------------------


def _run_drafter(target, references, folder, mode):
    """(generations, every draft block proposed, in order) for the draft in `folder` served in `mode`."""
    drafter, _ = load_drafter(folder, target.model, mode)
    runner = StaticTargetRunner(target.model, drafter.feature_layers) if mode.static_cache else None
    engine = SpecEngine(target.model, drafter, K, [], runner=runner)
    proposed, propose = [], drafter.propose

    def recording(*args):
        drafts, q = propose(*args)
        proposed.append(drafts.tolist())
        return drafts, q

    drafter.propose = recording
    return [engine.generate(ids, MAX_NEW) for ids, _ in references], proposed


@pytest.mark.parametrize("which", ["eagle3_folder", "sharp_folder"])
def test_static_eagle3_drafter_is_lossless_and_drafts_as_the_dynamic_one(target, references, which, request,
                                                                         span):
    folder = request.getfixturevalue(which)
    static, static_drafts = _run_drafter(target, references, folder, STATIC)
    dynamic, dynamic_drafts = _run_drafter(target, references, folder, DYNAMIC)
    for (ids, ref), s, d in zip(references, static, dynamic):
        assert s.tokens == ref[:MAX_NEW]
        assert s.accepted == d.accepted
    assert static_drafts == dynamic_drafts  # the same draft tokens, cycle by cycle
    if which == "eagle3_folder":  # the agreeing draft is often right: padding rows and partial accepts occur
        accepted = [a for g in static for a in g.accepted]
        assert max(accepted) >= 2 and 0 in accepted


def _check_drafter_state(target, references, folder):
    """After a request, the static drafter's state (its logits at the last extended position) is what one
    teacher-forced pass over the committed sequence gives."""
    drafter, loaded = load_drafter(folder, target.model, STATIC)
    ids, ref = references[1]
    got = SpecEngine(target.model, drafter, K, [], runner=StaticTargetRunner(target.model, drafter.feature_layers)
                     ).generate(ids, MAX_NEW)
    assert got.tokens == ref[:MAX_NEW]
    n = drafter.length
    seq = torch.tensor([ids + got.tokens])
    with torch.no_grad():
        hs = target.model(seq, output_hidden_states=True).hidden_states
        features = torch.cat([hs[k + 1] for k in loaded.feature_layers], -1)
        logits, _ = loaded.model(seq[:, 1: n + 1], features[:, :n], torch.arange(n)[None])
    torch.testing.assert_close(drafter.logits, logits[0, -1], atol=1e-3, rtol=1e-4)


def test_static_drafter_state_equals_a_full_forward(target, references, sharp_folder, span):
    _check_drafter_state(target, references, sharp_folder)


def _cache_trace(static: bool, full_span: bool) -> list[torch.Tensor]:
    """The draft cache through cycles as the drafter drives it: a prompt extend, drafting steps (their entries
    dropped after), extends of num_steps + 1 rows of which only some are real (the rest padding). Random q/k/v,
    so attention is spread and every visible key counts. Returns the real rows' outputs."""
    from draftlab.model.draft import KVCache

    g = torch.Generator().manual_seed(0)
    cache = draft_cache.StaticKVCache(1, 64) if static else KVCache(1)
    length, outs = 0, []

    def attend(rows: int, real: int) -> None:
        q, k, v = (torch.randn(1, 4, rows, 8, generator=g) for _ in range(3))
        if static:
            cache.slots = torch.arange(length, length + rows)
            cache.span = None if full_span else length + rows
            outs.append(cache.attend(0, q, k[:, :2], v[:, :2])[:, :, :real])
        else:
            outs.append(cache.attend(0, q[:, :, :real], k[:, :2, :real], v[:, :2, :real]))

    attend(6, 6)
    length = 6
    for committed in (2, 1, 5, 3):
        for j in range(K - 1):  # drafting steps at slots length + j, dropped afterwards
            attend(1, 1)
            length += 1
        length -= K - 1
        if not static:
            cache.crop(length)
        attend(K + 1, committed)  # the extend: committed real rows, then padding
        if not static:
            cache.crop(length + committed)
        length += committed
    return outs


@pytest.mark.parametrize("full_span", [False, True])
def test_static_draft_cache_attends_as_the_dynamic_one(full_span):
    for got, want in zip(_cache_trace(True, full_span), _cache_trace(False, full_span), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("broken", [lambda slots, n: (torch.arange(n)[None, :] < slots[:, None])[None, None],
                                    lambda slots, n: (torch.arange(n)[None, :] <= slots[:, None] + 1)[None, None]])
def test_a_wrong_draft_mask_is_caught(monkeypatch, broken):
    """A query that cannot see its own slot, or sees the slot after it (padding, a stale draft), is caught."""
    monkeypatch.setattr(draft_cache, "visible", broken)
    with pytest.raises(AssertionError):
        test_static_draft_cache_attends_as_the_dynamic_one(full_span=True)


def test_static_eagle3_sampling_runs(target, references, eagle3_folder):
    drafter, _ = load_drafter(eagle3_folder, target.model, STATIC)
    engine = SpecEngine(target.model, drafter, K, [], runner=StaticTargetRunner(target.model, drafter.feature_layers))
    got = engine.generate(references[0][0], MAX_NEW, temperature=0.8, generator=torch.Generator().manual_seed(0))
    assert len(got.tokens) == MAX_NEW and got.verify_steps >= 1


def test_static_sampling_matches_target_distribution(small_model):
    prompt, horizon, n, temperature = [1, 2, 0, 2], 3, 600, 0.7
    probs = _exact_joint(small_model, prompt, horizon, temperature)
    engine = SpecEngine(small_model, BigramDrafter(V_SMALL), num_steps=2, eos_token_ids=[],
                        runner=StaticTargetRunner(small_model))
    g = torch.Generator().manual_seed(1234)
    counts = np.zeros(V_SMALL ** horizon)
    for _ in range(n):
        a, b, c = engine.generate(prompt, horizon, temperature=temperature, generator=g).tokens
        counts[(a * V_SMALL + b) * V_SMALL + c] += 1
    assert _chi2_pvalue(counts, probs) > 1e-3


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


# ops that copy a device value to the host (.item(), int(), float(), bool(): `item`, or `_local_scalar_dense`
# outside inference mode; `is_nonzero`, `equal`) or size their result by the data (`nonzero`, ...). tolist() reads
# memory without an op, so it is not seen; none of the step code calls it.
HOST_READS = {"item", "_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "unique",
              "_unique2", "unique_consecutive", "unique_dim", "repeat_interleave"}


class HostReads(TorchDispatchMode):
    """Records the host-reading ops run under it."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name in HOST_READS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


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


class _Calls(TorchDispatchMode):
    """Records each op with its shapes, dtypes and host-side (non-tensor) arguments: what a CUDA graph freezes."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map

        shown = tree_map(lambda a: ("tensor", tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else repr(a),
                         (args, kwargs or {}))
        self.calls.append((str(func), shown))
        return func(*args, **(kwargs or {}))


def _calls_at(steps, runner, drafter, position: int) -> dict[str, list]:
    """Each fixed-shape step's dispatched calls with the request at `position` (host lengths and device bases)."""
    runner.length = drafter.length = position
    runner._base.fill_(position)
    drafter._base.fill_(position)
    seen = {}
    with torch.inference_mode():
        for name, fn in steps.items():
            with _Calls() as calls:
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

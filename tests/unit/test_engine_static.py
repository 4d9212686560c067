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
(serve/cuda_graphs.py; its fallback is tested in test_engine_graphs.py, its capture on the GPU by
`python -m draftlab benchmark spec_decode_gpu`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_engine import (K, MAX_NEW, V_SMALL, BigramDrafter, ScriptDrafter, _chi2_pvalue, _exact_joint,
                         assert_drafter_state_is_a_full_forward,
                         eagle3_folder, references, sharp_folder, small_model, target)  # noqa: F401

from draftlab.serve import draft_cache, static_target
from draftlab.serve import engine as eng
from draftlab.serve.engine import SpecEngine, TargetRunner, target_decode
from draftlab.serve.modes import DYNAMIC, STATIC, load_drafter
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
    assert_drafter_state_is_a_full_forward(target, drafter, loaded, ids + got.tokens)


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

"""The sync-free engine (serve/sync_free.py) gives the per-cycle engine's output, cycle by cycle, in fp32.

- Speculative: the same tokens, accepted lengths and stops as engine.SpecEngine on the same static caches, for a
  draft that is often right (partial accepts and padding rows occur) and a sharp random one, with EOS inside a
  chunk and length limits that end mid-cycle; one engine reused across prompts.
- Plain: the same tokens as engine.target_decode, with EOS and every length around a chunk's size.
- The checks can fail: a cycle that advances the target's position by m instead of m + 1 is caught.
On the CPU the cycle runs eagerly; on a GPU it is one CUDA graph (`python -m draftlab benchmark spec_decode_gpu`).
"""

from __future__ import annotations

import pytest
import torch
from test_engine import K, MAX_NEW, eagle3_folder, references, sharp_folder, target  # noqa: F401

from draftlab.serve.engine import SpecEngine, target_decode
from draftlab.serve.modes import STATIC, load_drafter
from draftlab.serve.static_target import StaticTargetRunner
from draftlab.serve.sync_free import SYNC_EVERY, SyncFreePlain, SyncFreeSpec


def _engines(target, folder, eos=()):
    """(per-cycle engine, sync-free engine), each on its own static caches, same draft."""
    out = []
    for _ in range(2):
        drafter, _ = load_drafter(folder, target.model, STATIC)
        runner = StaticTargetRunner(target.model, drafter.feature_layers)
        out.append(SpecEngine(target.model, drafter, K, eos, runner=runner))
    return out[0], SyncFreeSpec(out[1])


@pytest.mark.parametrize("which", ["eagle3_folder", "sharp_folder"])
def test_sync_free_spec_equals_the_per_cycle_engine(target, references, which, request):
    per_cycle, sync_free_engine = _engines(target, request.getfixturevalue(which))
    accepted = []
    for ids, ref in references:  # one engine, every prompt: stale slots of the last request stay invisible
        want = per_cycle.generate(ids, MAX_NEW)
        got = sync_free_engine.generate(ids, MAX_NEW)
        assert got.tokens == want.tokens == ref[:MAX_NEW]
        assert got.accepted == want.accepted and got.committed == want.committed
        accepted += got.accepted
    if which == "eagle3_folder":
        assert max(accepted) >= 2 and 0 in accepted


def test_sync_free_spec_stops_where_the_per_cycle_engine_stops(target, references, eagle3_folder):
    per_cycle, sync_free_engine = _engines(target, eagle3_folder)
    for n, (ids, ref) in enumerate(references[:3]):
        for eos_at in (0, 2, 7, 13):
            per_cycle.eos = sync_free_engine.eos = {ref[eos_at]}
            want, got = per_cycle.generate(ids, MAX_NEW), sync_free_engine.generate(ids, MAX_NEW)
            assert got.tokens == want.tokens and got.stop == want.stop == "eos", (n, eos_at)
            assert got.accepted == want.accepted
    per_cycle.eos = sync_free_engine.eos = set()
    ids, ref = references[1]
    for max_new in range(1, (K + 1) * SYNC_EVERY + 3, 3):
        got = sync_free_engine.generate(ids, max_new)
        assert got.tokens == per_cycle.generate(ids, max_new).tokens and got.stop == "length", max_new


def test_sync_free_plain_equals_target_decode(target, references):
    plain = SyncFreePlain(StaticTargetRunner(target.model))
    runner = StaticTargetRunner(target.model)
    for n, (ids, ref) in enumerate(references):
        for max_new in (1, SYNC_EVERY - 1, SYNC_EVERY, SYNC_EVERY + 1, MAX_NEW):
            got = plain.generate(ids, max_new, [])
            want = target_decode(target.model, ids, max_new, [], runner=runner)
            assert got.tokens == want.tokens == ref[:max_new] and got.verify_steps == want.verify_steps
        got = plain.generate(ids, MAX_NEW, [ref[5]])
        assert got.tokens == ref[: ref.index(ref[5]) + 1] and got.stop == "eos", n


def test_a_wrong_position_update_is_caught(target, references, eagle3_folder, monkeypatch):
    per_cycle, sync_free_engine = _engines(target, eagle3_folder)

    def off_by_one(self):
        m, tokens = cycle(self)
        self.target_len -= 1  # the target's position advanced by m, not m + 1
        return m, tokens

    cycle = SyncFreeSpec._cycle
    monkeypatch.setattr(SyncFreeSpec, "_cycle", off_by_one)
    results = [(sync_free_engine.generate(ids, MAX_NEW).tokens, ref[:MAX_NEW]) for ids, ref in references]
    assert any(got != want for got, want in results)


def test_sampling_is_refused(target, eagle3_folder, references):
    _, engine = _engines(target, eagle3_folder)
    with pytest.raises(ValueError, match="greedy only"):
        engine.generate(references[0][0], 4, temperature=0.7, generator=torch.Generator())



def test_the_bench_measures_the_same_generations_sync_free(target, references, eagle3_folder):
    """serve/measure.py picks the sync-free decoders with CUDA graphs; forced here on the CPU, they decode what the
    per-cycle ones decode, EOS included."""
    from draftlab.serve.measure import measure

    prompts = [ids for ids, _ in references[:3]]
    eos = [references[0][1][6]]
    runs = []
    for sync in (False, True):
        drafter, _ = load_drafter(eagle3_folder, target.model, STATIC)
        runs.append(measure(target.model, drafter, prompts, K, MAX_NEW, 0.0, eos, mode=STATIC, sync_free=sync))
    per_cycle, sync_free_run = runs
    assert sync_free_run.sync_free and not per_cycle.sync_free
    assert [g.tokens for g in sync_free_run.spec] == [g.tokens for g in per_cycle.spec]
    assert [g.tokens for g in sync_free_run.base] == [g.tokens for g in per_cycle.base]
    assert [g.accepted for g in sync_free_run.spec] == [g.accepted for g in per_cycle.spec]
    assert per_cycle.spec[0].stop == "eos"
    assert set(sync_free_run.step_ms) == {"target_step_ms", "verify_step_ms", "draft_step_ms"}


def test_dynamic_caches_are_refused_by_name(target, eagle3_folder):
    from draftlab.serve.modes import DYNAMIC

    drafter, _ = load_drafter(eagle3_folder, target.model, DYNAMIC)
    with pytest.raises(TypeError, match="static caches.*TargetRunner and Eagle3Drafter"):
        SyncFreeSpec(SpecEngine(target.model, drafter, K, []))


def test_exact_cache_sizes_hold_a_chunk_and_the_chain_after_it(target, references, eagle3_folder, monkeypatch):
    """With caches sized exactly (no rounding up to 256 positions), every length limit still fits: the last chunk
    commits up to k tokens past the limit and the draft chain after it writes k - 1 positions more."""
    from draftlab.serve import static_target

    monkeypatch.setattr(static_target, "LENGTH_QUANTUM", 1)
    per_cycle, sync_free_engine = _engines(target, eagle3_folder)
    ids, ref = references[2]
    for max_new in range(1, MAX_NEW + 1):
        assert sync_free_engine.generate(ids, max_new).tokens == per_cycle.generate(ids, max_new).tokens, max_new

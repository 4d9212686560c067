"""The batched engine (serve/batch_engine.py, batch_runners.py, batch_cache.py) is lossless in fp32 at every batch
size, and each row drafts what it would draft alone.

- Greedy output of every row equals the target's own greedy decode at batch sizes 1, 2, 3 and 6, with prompts
  of different lengths (right padding, per-row positions) and with an EOS that ends some rows early (frozen rows).
- Row b's accept counts equal the single-request static engine's for that prompt: the draft's per-row slots and
  state rows line up (losslessness alone would not show a draft bug: the target corrects every draft).
- The checks can fail: one shared position for all rows (the padding bug) changes the output; the draft's state
  taken one row off changes the accept counts.
"""

from __future__ import annotations

import pytest
import torch
from test_engine import K, MAX_NEW, eagle3_folder, references, target  # noqa: F401

from draftlab.serve import batch_runners
from draftlab.serve.batch_engine import BatchSpecEngine, batch_target_decode
from draftlab.serve.batch_runners import BatchEagle3Drafter, BatchTargetRunner
from draftlab.serve.engine import SpecEngine, target_decode
from draftlab.serve.loader import load_draft_like_sglang
from draftlab.serve.modes import STATIC, load_drafter, target_runner


def _batch_engine(target, folder, k=K):
    loaded = load_draft_like_sglang(folder, target.model)
    return BatchSpecEngine(target.model, BatchEagle3Drafter(loaded.model, loaded.feature_layers), k, [])


def _batches(items: list, size: int) -> list[list]:
    return [items[i: i + size] for i in range(0, len(items), size)]


@pytest.mark.parametrize("batch", [1, 2, 3, 6])
def test_batched_greedy_equals_plain_decoding(target, references, eagle3_folder, batch):
    engine = _batch_engine(target, eagle3_folder)
    prompts = [ids for ids, _ in references]
    assert len({len(p) for p in prompts}) > 3  # rows really sit at different positions
    accepted = []
    for chunk in _batches(list(range(len(prompts))), batch):
        gens = engine.generate([prompts[i] for i in chunk], MAX_NEW)
        for i, gen in zip(chunk, gens):
            assert gen.tokens == references[i][1][:MAX_NEW], f"prompt {i} at batch size {batch}"
            assert gen.verify_steps == len(gen.accepted) and sum(gen.committed) + 1 == MAX_NEW
            accepted += gen.accepted
    assert max(accepted) == K and 0 in accepted  # full, partial and no acceptance all occurred


@pytest.mark.parametrize("batch", [2, 6])
def test_rows_finish_independently_at_eos(target, references, eagle3_folder, batch):
    eos = references[0][1][5]  # row 0 stops at its sixth token; rows without it run to the limit
    engine = _batch_engine(target, eagle3_folder)
    engine.eos = {eos}
    prompts = [ids for ids, _ in references][:batch]
    gens = engine.generate(prompts, MAX_NEW)
    base = batch_target_decode(BatchTargetRunner(target.model), prompts, MAX_NEW, [eos])
    stops = set()
    for ids, gen, plain in zip(prompts, gens, base):
        want = target_decode(target.model, ids, MAX_NEW, [eos])
        assert gen.tokens == want.tokens == plain.tokens and gen.stop == want.stop
        stops.add(gen.stop)
    assert gens[0].stop == "eos" and len(gens[0].tokens) <= 6
    if batch > 2:
        assert stops == {"eos", "length"}


def test_batched_baseline_equals_plain_decoding(target, references):
    prompts = [ids for ids, _ in references]
    gens = batch_target_decode(BatchTargetRunner(target.model), prompts, MAX_NEW, [])
    assert [g.tokens for g in gens] == [ref[:MAX_NEW] for _, ref in references]


def _single_accepts(target, references, folder) -> list[list[int]]:
    single = []
    for ids, _ in references:
        drafter, _loaded = load_drafter(folder, target.model, STATIC)
        runner = target_runner(target.model, STATIC, drafter.feature_layers)
        single.append(SpecEngine(target.model, drafter, K, [], runner=runner).generate(ids, MAX_NEW).accepted)
    return single


def test_rows_draft_what_they_draft_alone(target, references, eagle3_folder):
    single = _single_accepts(target, references, eagle3_folder)
    gens = _batch_engine(target, eagle3_folder).generate([ids for ids, _ in references], MAX_NEW)
    assert [g.accepted for g in gens] == single
    assert len({tuple(a) for a in single}) > 1  # the rows' histories differ, so their lengths drift apart


@pytest.mark.parametrize("shift", [-1, 1])
def test_a_drafter_off_by_one_is_caught(target, references, eagle3_folder, monkeypatch, shift):
    """The draft's state taken one row off in its extend: the target keeps every output right, the accept
    counts show it."""
    keep = batch_runners.BatchEagle3Drafter._keep

    def off(self, logits, hidden, rows):
        return keep(self, logits, hidden, (rows + shift).clamp(0, logits.shape[1] - 1))

    monkeypatch.setattr(batch_runners.BatchEagle3Drafter, "_keep", off)
    gens = _batch_engine(target, eagle3_folder).generate([ids for ids, _ in references], MAX_NEW)
    assert [g.tokens for g in gens] == [ref[:MAX_NEW] for _, ref in references]
    assert [g.accepted for g in gens] != _single_accepts(target, references, eagle3_folder)


def test_one_position_for_all_rows_is_caught(target, references, eagle3_folder, monkeypatch):
    def shared(base, count):  # every row at the longest row's position: padding becomes visible context
        return base.max() + torch.arange(count, device=base.device)[None, :].expand(base.shape[0], -1)

    monkeypatch.setattr(batch_runners, "row_slots", shared)
    gens = _batch_engine(target, eagle3_folder).generate([ids for ids, _ in references], MAX_NEW)
    assert any(g.tokens != ref[:MAX_NEW] for g, (_, ref) in zip(gens, references))


def test_batched_sampling_runs(target, references, eagle3_folder):
    gen = torch.Generator().manual_seed(0)
    gens = _batch_engine(target, eagle3_folder).generate([ids for ids, _ in references[:3]], MAX_NEW, 0.8, gen)
    assert all(len(g.tokens) == MAX_NEW and g.verify_steps >= 1 for g in gens)

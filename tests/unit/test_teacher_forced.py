"""Predicted against deployed on the same prompts and positions (serve/teacher_forced.py), in fp32:

- `walk` over the teacher-forced chains takes exactly the engine's verify steps on every prompt: the chains are
  what deployment drafts, and the walk is deployment's count;
- `tf_tau` is training's predicted tau (train/ttt.py ttt_unroll + summarize, summed over the prompts) on the
  same sequences: the same definition, not a look-alike;
- so the gap between them on one set of answers is the definition alone (here large: the tiny target repeats
  itself, so acceptance varies a lot along an answer). A walk started one position off is caught.
"""

from __future__ import annotations

import pytest
import torch
from test_engine import K, eagle3_folder, target  # noqa: F401

from draftlab.serve.engine import SpecEngine, target_decode
from draftlab.serve.loader import load_draft_like_sglang
from draftlab.serve.modes import STATIC, load_drafter, target_runner
from draftlab.serve.teacher_forced import chain_lengths, pooled, prompt_row, walk
from draftlab.train import ttt

TEXTS = ["Hello there", "What is the capital of France?", "Write a poem about the sea", "abc", "1+1=",
         "Why is the sky blue?"]
NEW = 30


@pytest.fixture(scope="module")
def runs(target, eagle3_folder):
    """Per prompt: (ids, the plain decode's answer, the engine's Generation) with the static engine."""
    out = []
    for text in TEXTS:
        ids = target.chat_ids(text)
        drafter, _ = load_drafter(eagle3_folder, target.model, STATIC)
        runner = target_runner(target.model, STATIC, drafter.feature_layers)
        spec = SpecEngine(target.model, drafter, K, target.eos_token_ids, runner=runner).generate(ids, NEW)
        out.append((ids, target_decode(target.model, ids, NEW, target.eos_token_ids).tokens, spec))
    return out


@pytest.fixture(scope="module")
def draft(target, eagle3_folder):
    loaded = load_draft_like_sglang(eagle3_folder, target.model)
    return loaded.model, loaded.feature_layers


def test_the_walk_is_the_engines_count(target, runs, draft):
    model, layers = draft
    for ids, answer, spec in runs:
        assert spec.tokens == answer
        row = prompt_row(target.model, model, layers, ids, answer, K)
        assert (row["walk_tokens"], row["walk_steps"]) == (len(spec.tokens), spec.verify_steps)
    steps = {spec.verify_steps for *_, spec in runs}
    assert len(steps) > 1  # prompts accept differently


def test_a_walk_one_position_off_is_caught(target, runs, draft):
    model, layers = draft
    off = []
    for ids, answer, spec in runs:
        correct, _ = chain_lengths(target.model, model, layers, ids, answer, K)
        off.append(walk(correct, len(ids) + 1, len(answer))[1] != spec.verify_steps)
    assert any(off)


def _training_predicted_tau(target, model, layers, runs) -> float:
    """train/ttt.py's own predicted tau, its stats summed over the prompts as a validation pass sums batches."""
    total = None
    for ids, answer, _ in runs:
        seq = torch.tensor([ids + answer])
        out = target.model(input_ids=seq, output_hidden_states=True)
        logits = out.logits.float()
        targets = ttt.Targets(logits.softmax(-1), logits.argmax(-1), torch.ones_like(seq, dtype=torch.bool))
        mask = torch.tensor([[0] * len(ids) + [1] * len(answer)])
        batch = {"input_ids": seq, "features": torch.cat([out.hidden_states[i + 1] for i in layers], -1),
                 "loss_mask": mask, "attention_mask": torch.ones_like(mask)}
        with torch.no_grad():
            _, stats = ttt.ttt_unroll(model, batch, targets, K, 0.8)
        total = stats if total is None else total + stats
    return ttt.summarize(total, 0.8, K)["predicted_tau"]


def test_tf_tau_is_trainings_predicted_tau_and_the_walk_is_lower(target, runs, draft):
    model, layers = draft
    rows = [prompt_row(target.model, model, layers, ids, answer, K) for ids, answer, _ in runs]
    both = pooled(rows, K)
    assert both["tf_tau"] == pytest.approx(_training_predicted_tau(target, model, layers, runs), rel=1e-9)
    engine_tau = sum(len(s.tokens) for *_, s in runs) / sum(s.verify_steps for *_, s in runs)
    assert both["walk_tau"] == pytest.approx(engine_tau)
    assert both["walk_tau"] < both["tf_tau"]  # the definition alone, on the same prompts and positions

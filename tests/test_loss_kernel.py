"""bench/loss_kernel.py times the packed unroll's loss with its soft targets as fp32 probabilities and as bf16
logits: both variants compute one loss (the bench checks it) with the trainer's own soft cross-entropy."""

from __future__ import annotations

import pytest
import torch

from conftest import bench_script


def _inputs(pairs=24, vocab=16, capacity=8):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(pairs, vocab, generator=g).to(torch.bfloat16).requires_grad_(True)
    teacher = (3 * torch.randn(capacity, vocab, generator=g)).to(torch.bfloat16)
    index = torch.randint(0, capacity, (pairs,), generator=g)
    weight = torch.rand(pairs, generator=g) < 0.8
    top = torch.randint(0, vocab, (pairs,), generator=g)
    return logits, teacher, index, weight, top


def test_both_soft_target_forms_give_one_loss_and_one_gradient():
    bench = bench_script("loss_kernel")
    logits, *rest = _inputs()
    results = []
    for targets in (bench.probs_targets, bench.logits_targets):
        logits.grad = None
        loss, hits = bench.unroll_loss(targets, logits, *rest, steps=3)
        loss.backward()
        results.append((float(loss.detach()), int(hits), logits.grad.clone()))
    (loss_a, hits_a, grad_a), (loss_b, hits_b, grad_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-5) and hits_a == hits_b
    assert torch.allclose(grad_a.float(), grad_b.float(), atol=1e-3) and grad_a.abs().sum() > 0


def test_the_targets_are_the_teachers_softmax_at_the_gathered_rows():
    bench = bench_script("loss_kernel")
    _, teacher, index, _, _ = _inputs()
    want = teacher.float().softmax(-1)[index]
    assert torch.allclose(bench.logits_targets(teacher)(index), want, rtol=1e-5, atol=1e-7)
    assert torch.allclose(bench.probs_targets(teacher)(index), want)

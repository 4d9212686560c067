"""benchmarks/loss_kernel.py times the packed unroll's loss with its soft targets as fp32 probabilities and as bf16
logits, step by step, and over every pair at once (`pairs`): all variants compute one loss and one gradient (the
bench checks the loss) with the trainer's own functions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import BENCHMARKS, benchmark_script


def _inputs(pairs=24, vocab=16, capacity=8):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(pairs, vocab, generator=g).to(torch.bfloat16).requires_grad_(True)
    teacher = (3 * torch.randn(capacity, vocab, generator=g)).to(torch.bfloat16)
    index = torch.randint(0, capacity, (pairs,), generator=g)
    weight = torch.rand(pairs, generator=g) < 0.8
    # the draft's own argmax at about half the pairs: enough hits that one counted outside `weight` shows
    other = torch.randint(0, vocab, (pairs,), generator=g)
    top = torch.where(torch.rand(pairs, generator=g) < 0.5, logits.argmax(-1), other)
    return logits, teacher, index, weight, top


def test_every_variant_gives_one_loss_one_gradient_and_the_same_hits():
    bench = benchmark_script("loss_kernel")
    logits, *rest = _inputs()
    results = []
    for targets, loss_fn in bench.VARIANTS.values():
        logits.grad = None
        loss, hits = loss_fn(targets, logits, *rest, steps=3)
        loss.backward()
        results.append((float(loss.detach()), logits.grad.clone(), int(hits)))
    assert len(results) == 3
    loss_a, grad_a, hits_a = results[0]
    assert hits_a == int(((logits.argmax(-1) == rest[3]) & rest[2]).sum()) > 0  # the pairs that train
    assert grad_a.abs().sum() > 0
    for loss_b, grad_b, hits_b in results[1:]:
        assert loss_a == pytest.approx(loss_b, rel=1e-5) and hits_a == hits_b
        assert torch.allclose(grad_a.float(), grad_b.float(), atol=1e-3)


def test_the_bf16_form_gives_the_teachers_softmax_at_the_gathered_rows():
    bench = benchmark_script("loss_kernel")
    _, teacher, index, _, _ = _inputs()
    want = teacher.float().softmax(-1)[index]
    assert torch.allclose(bench.logits_targets(teacher)(index), want, rtol=1e-5, atol=1e-7)


def test_the_bench_runs_every_variant_and_checks_they_agree():
    """The CLI on the CPU, tiny: one JSON line per variant, the same loss in both (else it raises)."""
    command = [sys.executable, str(BENCHMARKS / "loss_kernel.py"), "--device", "cpu", "--capacity", "16",
               "--vocab", "32", "--steps", "3", "--repeats", "1"]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [line["variant"] for line in lines] == ["probs", "logits", "pairs"] and lines[0]["pairs"] == 48
    assert all(line["loss"] == pytest.approx(lines[0]["loss"], rel=1e-4) for line in lines[1:])
    assert all(line["ms_forward_backward"] > 0 for line in lines)

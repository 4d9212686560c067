"""The packed unroll's loss alone, compiled, forward and backward: its soft targets read as fp32 probabilities
(the trainer before 2026-12-04) or formed in the loss from the teacher's bf16 logits and their logsumexp
(`ttt.soft_targets`, the trainer's since), step by step or over every pair at once (`pairs`, the trainer's since
2026-12-05). On the H200 the fused reduction over [pairs, draft vocabulary] was 28% of the GPU's training step;
this times it on its own, at the preset's sizes.

The shapes are the trainer's (train/packed.py `packed_core`): `--steps` TTT steps of `--capacity` pairs each, one
soft cross-entropy (`ttt.step_loss`) and one argmax match per step, the teacher's rows gathered by index, the head's
logits in bf16. The trainer compiles with dynamic shapes; this bench, by default, for these sizes alone
(`--dynamic`: as the trainer), which is one way its result may differ from the trainer's. It does: on the H200 it
timed the logits form 1.74x slower, while in the profiled trainer the same change cut the loss's kernels by 3.2 ms a
step. Its numbers are the loss alone, not the trainer's. Why the logits form
timed slower here: the steps' slices of one logits tensor make its gradient a concatenation, and Inductor wrote it
as one kernel in which every element computes every step's branch, two exps each with logits (one with
probabilities). `pairs`, the trainer's form, is one pass over every pair.

    python benchmarks/loss_kernel.py --device cuda                  # the preset: 7 steps of 14,336 pairs, vocab 8,192
    python benchmarks/loss_kernel.py --device cpu --capacity 256 --vocab 512 --repeats 3   # a smoke run
Prints one JSON line per variant: milliseconds per forward and backward, and the bytes the soft targets and logits
take in each direction.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from draftlab.train.ttt import soft_ce_rows, soft_targets, step_loss, step_term  # noqa: E402


def probs_targets(teacher: torch.Tensor):
    """Before: the teacher's softmax formed once in fp32; each step gathers its rows."""
    probs = teacher.float().softmax(-1)
    return lambda index: probs.index_select(0, index)


def logits_targets(teacher: torch.Tensor):
    """Since: the logsumexp formed once; each step forms its rows' targets from the bf16 logits."""
    lse = teacher.float().logsumexp(-1)
    return lambda index: soft_targets(teacher.index_select(0, index), lse.index_select(0, index))


def unroll_loss(targets, logits: torch.Tensor, teacher: torch.Tensor, index: torch.Tensor, weight: torch.Tensor,
                top: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and argmax matches over `steps` equal slices, as packed_core computed them step by step (until
    2026-12-05)."""
    loss, hits, rows_of = logits.new_zeros((), dtype=torch.float32), 0, targets(teacher)
    for j, (lg, idx, w, tp) in enumerate(zip(logits.chunk(steps), index.chunk(steps), weight.chunk(steps),
                                             top.chunk(steps))):
        loss = loss + step_loss(lg, rows_of(idx), w, j, 0.8, None)[0]
        hits = hits + ((lg.argmax(-1) == tp) & w).sum()  # the trainer counts the pairs that train
    return loss, hits


def pairs_loss(targets, logits: torch.Tensor, teacher: torch.Tensor, index: torch.Tensor, weight: torch.Tensor,
               top: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same loss and matches with every step's pairs in one soft cross-entropy and one argmax, the steps' sums
    taken from its rows: packed_core's since 2026-12-05, compiled (train/packed.py `_pair_ce`)."""
    ce = torch.where(weight, soft_ce_rows(logits, targets(teacher)(index)), 0.0)
    loss = logits.new_zeros((), dtype=torch.float32)
    for j, (c, w) in enumerate(zip(ce.chunk(steps), weight.chunk(steps))):
        loss = loss + step_term(c.sum(), w.sum(), j, 0.8, None)
    return loss, ((logits.argmax(-1) == top) & weight).sum()


# name: (the soft targets' form, the loss's form)
VARIANTS = {"probs": (probs_targets, unroll_loss), "logits": (logits_targets, unroll_loss),
            "pairs": (logits_targets, pairs_loss)}


def timed(fn, logits: torch.Tensor, inputs: tuple, repeats: int, sync) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Seconds for `repeats` forward and backward passes of fn, and the last pass's loss and hits."""
    start = time.perf_counter()
    for _ in range(repeats):
        logits.grad = None
        loss, hits = fn(logits, *inputs)
        loss.backward()
    sync()
    return time.perf_counter() - start, loss.detach(), hits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--capacity", type=int, default=14336, help="pairs per step (the preset's padded capacity)")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--variants", default="probs,logits,pairs")
    ap.add_argument("--dynamic", action="store_true", help="compile with dynamic shapes, as the trainer does")
    args = ap.parse_args()
    dev = torch.device(args.device)
    g = torch.Generator(device="cpu").manual_seed(0)
    pairs = args.capacity * args.steps
    logits = (torch.randn(pairs, args.vocab, generator=g) * 2).to(dev, torch.bfloat16).requires_grad_(True)
    inputs = ((torch.randn(args.capacity, args.vocab, generator=g) * 3).to(dev, torch.bfloat16),  # the teacher
              torch.randint(0, args.capacity, (pairs,), generator=g).to(dev),  # each pair's teacher row
              (torch.rand(pairs, generator=g) < 0.9).to(dev),  # the pairs that count
              torch.randint(0, args.vocab, (pairs,), generator=g).to(dev))  # the target's top-1
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    values = {}
    for name in args.variants.split(","):
        targets, loss_fn = VARIANTS[name]
        fn = torch.compile(lambda *a, t=targets, f=loss_fn: f(t, *a, args.steps), dynamic=args.dynamic)
        compile_s, _, _ = timed(fn, logits, inputs, 3, sync)  # compile, then warm
        seconds, loss, hits = timed(fn, logits, inputs, args.repeats, sync)
        values[name] = float(loss)
        target_bytes = pairs * args.vocab * (4 if name == "probs" else 2)
        print(json.dumps({"variant": name, "device": str(dev), "pairs": pairs, "vocab": args.vocab,
                          "dynamic": args.dynamic, "ms_forward_backward": round(seconds / args.repeats * 1e3, 3),
                          "compile_s": round(compile_s, 1), "loss": round(values[name], 6), "hits": int(hits),
                          "soft_target_gb_read_per_pass": round(target_bytes / 1e9, 2),
                          "logits_gb_per_pass": round(pairs * args.vocab * 2 / 1e9, 2)}), flush=True)
    if len(values) > 1:  # the variants are one loss: a bench that timed a different one would say so here
        first = next(iter(values.values()))
        assert all(abs(v - first) <= 1e-4 * abs(first) for v in values.values()), values


if __name__ == "__main__":
    main()

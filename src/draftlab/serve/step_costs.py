"""What one engine step costs, and the speed-up those costs allow.

Each fixed-shape step of a static-cache engine is replayed on its own (its CUDA graph when captured): the target's
one-token step (plain decoding), its verify step of k + 1 tokens, and the draft's work per cycle (the extend over
k + 1 rows plus the chain of k - 1 forwards and k argmaxes), divided by k. The bound is

    tau / (1 + k * draft step / target step)

the speed-up of an engine that spends nothing beyond those steps and whose verify costs a plain step (at batch 1
a verify of a few tokens costs about one: the step is bound by its launches and weights, not by its tokens).
"""

from __future__ import annotations

import time

import torch

from draftlab.serve.engine import _sync


def _ms(step, device: torch.device, repeats: int) -> float:
    step()  # captured (or warmed) outside the timing
    _sync(device)
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    _sync(device)
    return 1000 * (time.perf_counter() - started) / repeats


@torch.inference_mode()
def measure(target, drafter, plain_runner, k: int, repeats: int | None = None) -> dict[str, float]:
    """{target_step_ms, verify_step_ms, draft_step_ms} for static runners and a static drafter, else {}.
    Positions are reset to 0 first: the steps read whatever the buffers hold, at a valid position."""
    if not all(hasattr(part, "_step") for part in (target, plain_runner)) or not hasattr(drafter, "_extend_step"):
        return {}
    device = target.device
    repeats = repeats or (50 if device.type == "cuda" else 5)
    target.reset()
    plain_runner.reset()
    drafter.length = 0
    drafter._base.zero_()
    drafter.propose(k, 0.0, None)  # makes the chain step
    chain = drafter._propose[k]
    extend = drafter._extend_step(k + 1)[0]
    out = {"target_step_ms": _ms(plain_runner._step(1, False)[0], device, repeats),
           "verify_step_ms": _ms(target._step(k + 1, True)[0], device, repeats)}
    out["draft_step_ms"] = (_ms(extend, device, repeats) + _ms(chain, device, repeats)) / k
    return out


def bound(tau: float, k: int, costs: dict[str, float]) -> float:
    """tau / (1 + k * draft step / target step): nan without costs."""
    if not costs or costs.get("target_step_ms", 0) <= 0:
        return float("nan")
    return tau / (1 + k * costs["draft_step_ms"] / costs["target_step_ms"])

"""What one engine step costs, and the speed-up those costs allow.

Each fixed-shape step of a static-cache engine is replayed on its own (its CUDA graph when captured) at a position
the measured requests reached: the target's one-token step (plain decoding), its verify step of k + 1 tokens, and
the draft's work per cycle (the extend over k + 1 rows plus the chain of k - 1 forwards and k argmaxes), divided by
k. Two bounds follow:

    tau / (1 + k * draft step / target step)          a verify costing one plain step (`bound`)
    tau * target step / (verify step + k * draft step)  the verify step as measured (`bound_with_verify`)

the speed-ups of an engine that spends nothing beyond those steps.
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
def measure(target, drafter, plain_runner, k: int, position: int, repeats: int | None = None) -> dict[str, float]:
    """{target_step_ms, verify_step_ms, draft_step_ms} for static runners and a static drafter, else {}. Every step
    runs at `position` (clamped to the caches): an eager step attends over the slots before it, as in a request
    there; a graph attends over all of them anyway."""
    if not all(hasattr(part, "_step") for part in (target, plain_runner)) or not hasattr(drafter, "_extend_step"):
        return {}
    device = target.device
    repeats = repeats or (50 if device.type == "cuda" else 5)
    position = max(0, min(position, target.max_len, plain_runner.max_len, drafter.cache.max_len) - 2 * (k + 1))
    for part in (target, plain_runner, drafter):
        part.length = position
        part._base.fill_(position)
    drafter.propose(k, 0.0, None)  # makes the chain step
    chain = drafter._propose[k]
    extend = drafter._extend_step(k + 1)[0]
    out = {"target_step_ms": _ms(plain_runner._step(1, False)[0], device, repeats),
           "verify_step_ms": _ms(target._step(k + 1, True)[0], device, repeats)}
    out["draft_step_ms"] = (_ms(extend, device, repeats) + _ms(chain, device, repeats)) / k
    return out


def bound(tau: float, k: int, costs: dict[str, float]) -> float:
    """tau / (1 + k * draft step / target step): nan without costs."""
    return _bound(tau, k, costs, "target_step_ms")


def bound_with_verify(tau: float, k: int, costs: dict[str, float]) -> float:
    """tau * target step / (verify step + k * draft step): nan without costs."""
    return _bound(tau, k, costs, "verify_step_ms")


def _bound(tau: float, k: int, costs: dict[str, float], verify: str) -> float:
    """tau tokens a cycle over the cycle's cost in plain steps, the verify costing `costs[verify]`."""
    if not costs or costs.get("target_step_ms", 0) <= 0:
        return float("nan")
    return tau * costs["target_step_ms"] / (costs[verify] + k * costs["draft_step_ms"])

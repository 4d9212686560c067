"""Fixed-shape engine steps run eagerly or as CUDA graphs: captured once per shape, then replayed.

A step is a function of no arguments that reads its inputs from static buffers (filled by the caller before each
call) and returns a tuple of tensors. Eagerly it simply runs. As a graph it is captured at its first call, with
that call's real inputs:
1. warm-up runs on a side stream (lazy allocations, cuBLAS handles and kernel choices happen outside the capture);
2. capture into a `torch.cuda.CUDAGraph` (the outputs become static tensors that every replay overwrites);
3. one replay, compared with the warm-up's eager result: a step that reads something the capture froze (a host
   value, a tensor that is not a static buffer) gives different numbers here and is refused.
Steps must be idempotent for this (running one twice on the same buffers writes the same KV entries), which the
engine's steps are: each writes its KV slots from its inputs alone. A step that advances state of its own (a whole
speculative cycle moves its positions on: serve/sync_free.py) names those tensors as `state`; they are put back
before each warm-up run and before the check replay, so the check replay is the step's one real run.

Any failure (an op that syncs with the host, an unsupported kernel, a mismatch) logs one warning line naming the
step and the error, and the step runs eagerly from then on, so a benchmark still finishes and says why. A capture
that fails inside torch.cuda.graph can leave torch's allocator believing it still captures (torch < 2.12), so after
one no other step is captured in the process; the caller's stream, which torch.cuda.graph leaves switched then, is
restored (`capture_into`).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

log = logging.getLogger("draftlab.serve")

GRAPH_SETTINGS = ("auto", "true", "false")
WARMUP_RUNS = 2
_broken_capture: str | None = None  # the first capture that failed in this process (no capture is tried after it)


def graphs_enabled(setting, device: torch.device, key: str = "bench.cuda_graphs") -> bool:
    """auto = on for CUDA, off elsewhere; true on a non-CUDA device is an error naming the key."""
    value = str(setting).lower()
    if value not in GRAPH_SETTINGS:
        raise ValueError(f"{key}: {setting!r} is not one of {', '.join(GRAPH_SETTINGS)}")
    if value == "true" and torch.device(device).type != "cuda":
        raise ValueError(f"{key}: true needs a CUDA target, this one runs on {device} (use auto or false)")
    return value == "true" or (value == "auto" and torch.device(device).type == "cuda")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Replay against eager: integers exactly, floats up to kernel-choice noise (a stale buffer is far off)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    scale = 1.0 + float(b.float().abs().max()) if b.numel() else 1.0
    return float((a.float() - b.float()).abs().max()) <= 1e-2 * scale if a.numel() else True


class StepGraph:
    """One fixed-shape step; `enabled` = capture it as a CUDA graph at the first call (else run it eagerly)."""

    def __init__(self, fn: Callable[[], tuple[torch.Tensor, ...]], name: str, enabled: bool,
                 device: torch.device | str | None = None, state: tuple[torch.Tensor, ...] = ()):
        """device: where fn's tensors live (default: the current CUDA device). The capture must run there: kernels
        on another device than the capture stream's are not recorded, and the graph would replay nothing.
        state: tensors fn updates in place from their own values (positions, counters), restored around warm-ups."""
        self.fn, self.name, self.enabled, self.device = fn, name, enabled, device
        self.carried = tuple(state)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple[torch.Tensor, ...] | None = None
        self.failure: str | None = None  # why the step fell back to eager, for the benchmark's report

    @property
    def captured(self) -> bool:
        return self.graph is not None

    @property
    def state(self) -> str:
        """For the benchmark's report: 'graph' (captured), 'eager', or why its capture failed."""
        return "graph" if self.captured else (self.failure or "eager")

    def __call__(self) -> tuple[torch.Tensor, ...]:
        if self.graph is not None:
            self.graph.replay()
            return self.outputs
        if not self.enabled:
            return self.fn()
        return self._capture()

    def _capture(self) -> tuple[torch.Tensor, ...]:
        saved = [t.clone() for t in self.carried]

        def restore():
            for t, s in zip(self.carried, saved):
                t.copy_(s)

        def warm():
            restore()
            return tuple(t.clone() for t in self.fn())

        try:
            refuse_after_a_broken_capture()
            with torch.cuda.device(self.device):
                graph, outputs, expected = warm_up_and_capture(lambda: tuple(self.fn()), WARMUP_RUNS, warm=warm)
                for out in outputs:  # so that a replay that does nothing (an empty graph) cannot pass the check
                    out.fill_(float("nan") if out.is_floating_point() else -1)
                restore()
                graph.replay()
                bad = [i for i, (got, want) in enumerate(zip(outputs, expected)) if not _same(got, want)]
            if bad:
                raise RuntimeError(f"replay differs from the eager step in output(s) {bad}")
        except Exception as err:  # noqa: BLE001 - any capture failure means: run this step eagerly
            self.enabled, self.failure = False, f"{type(err).__name__}: {err}".splitlines()[0][:300]
            log.warning("CUDA graph for %s not used, it runs eagerly: %s", self.name, self.failure)
            recover()
            restore()
            return self.fn()
        self.graph, self.outputs = graph, outputs
        log.info("CUDA graph captured for %s", self.name)
        return outputs


def warm_up_and_capture(fn: Callable, runs: int, warm: Callable | None = None):
    """On the current CUDA device: `warm` (default: fn) `runs` times on a side stream, so that lazy allocations,
    cuBLAS handles and kernel choices happen outside the capture; then one call of fn captured into a new graph on
    this device's own capture stream (torch.cuda.graph's default one belongs to whichever device was current at
    its first use), in thread-local error mode (other threads, a shard writer say, may use CUDA meanwhile).
    Returns (graph, fn's captured outputs, warm's last result). Raises as `capture_into` does."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(runs):
            warmed = (warm or fn)()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    outputs = capture_into(graph, fn, stream=torch.cuda.Stream(), capture_error_mode="thread_local")
    return graph, outputs, warmed


def capture_into(graph: torch.cuda.CUDAGraph, fn: Callable[[], tuple[torch.Tensor, ...]], **kwargs):
    """Captures fn() into `graph` (torch.cuda.graph) and returns its outputs. When the capture fails (an op that
    syncs with the host invalidates it), torch.cuda.graph's exit raises from `capture_end` before it restores the
    caller's stream, which would leave every later eager step on the capture stream: restored here, either way."""
    global _broken_capture
    stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, **kwargs):
            return fn()
    except Exception as err:
        # torch < 2.12 (pytorch#180395) raises from capture_end before it ends the allocator's routing into the
        # graph's pool, so every later capture fails (its empty_cache() asserts captures_underway.empty()): later
        # steps stay eager, naming this first failure rather than that assert
        _broken_capture = _broken_capture or f"{type(err).__name__}: {err}".splitlines()[0][:200]
        raise
    finally:
        torch.cuda.set_stream(stream)


def refuse_after_a_broken_capture() -> None:
    """Raises once a capture in this process has failed inside torch.cuda.graph (see `capture_into`)."""
    if _broken_capture:
        raise RuntimeError(f"an earlier capture in this process failed ({_broken_capture}), and torch may not "
                           "recover from one: no more captures")


def recover(device=None) -> None:
    """After a failed capture, leave no capture half-open on the device (later eager work must run)."""
    if torch.cuda.is_available():
        try:
            torch.cuda.synchronize(device)
        except Exception as err:  # noqa: BLE001 - the eager fallback will raise the real error if any
            log.warning("CUDA state after the failed capture: %s", err)

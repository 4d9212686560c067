"""How the local engine runs: dynamic KV cache, static KV cache, or static KV cache + CUDA graphs.

`bench.static_cache` (true/false) and `bench.cuda_graphs` (auto/true/false; auto = on for a CUDA target) pick
the mode; every mode gives the same greedy output in exact arithmetic (tests/unit/test_engine_static.py checks fp32).
This module turns the mode into the drafter and the target runners that serve/engine.py drives.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from draftlab.serve.cuda_graphs import graphs_enabled

log = logging.getLogger("draftlab.serve")


@dataclass(frozen=True)
class EngineMode:
    static_cache: bool
    cuda_graphs: bool

    @property
    def name(self) -> str:
        return "static+graphs" if self.cuda_graphs else ("static" if self.static_cache else "dynamic")


DYNAMIC = EngineMode(False, False)
STATIC = EngineMode(True, False)
GRAPHS = EngineMode(True, True)
NAMED = {"dynamic": DYNAMIC, "static": STATIC, "graphs": GRAPHS}


def engine_mode(static_cache: bool, cuda_graphs, device: torch.device, model=None) -> EngineMode:
    """The mode for the bench keys; auto graphs follow the device and need the static cache. A target split over
    several devices (target.device_map), with sliding-window layers or with an attention other than sdpa/eager
    keeps the dynamic cache: the static one lives on one device, masks full causal attention only and passes its
    own 4D mask."""
    from draftlab.serve.static_target import static_cache_obstacle

    graphs = graphs_enabled(cuda_graphs, device)
    why = None
    if model is not None and static_cache and len({p.device for p in model.parameters()}) > 1:
        why = "the target spans several devices (target.device_map)"
    elif static_cache and getattr(model, "config", None) is not None:
        why = static_cache_obstacle(model.config)
    if why:
        if str(cuda_graphs).lower() == "true":
            raise ValueError(f"bench.cuda_graphs: true needs the static KV cache, and {why}")
        log.warning("bench: %s, so the engine keeps the dynamic KV cache", why)
        return DYNAMIC
    if graphs and not static_cache:
        if str(cuda_graphs).lower() == "true":
            raise ValueError("bench.cuda_graphs: true needs fixed shapes, i.e. bench.static_cache=true")
        graphs = False  # auto: graphs only where the shapes allow them
    return EngineMode(bool(static_cache), graphs)


def target_runner(model, mode: EngineMode, feature_layers=(), max_len: int = 0):
    """The target's runner for the engine (feature_layers = the drafter's) or for plain decoding (none)."""
    if mode.static_cache:
        from draftlab.serve.static_target import StaticTargetRunner

        return StaticTargetRunner(model, feature_layers, graphs=mode.cuda_graphs, max_len=max_len)
    from draftlab.serve.engine import TargetRunner

    return TargetRunner(model, feature_layers)


def load_drafter(folder, target_model, mode: EngineMode, rules: str = "current", dtype: torch.dtype | None = None,
                 max_len: int = 0):
    """(drafter, LoadedDraft): the exported draft as SGLang would load it, on this mode's cache."""
    if mode.static_cache:
        from draftlab.serve.loader import load_draft_like_sglang
        from draftlab.serve.static_drafter import StaticEagle3Drafter

        loaded = load_draft_like_sglang(folder, target_model, rules, dtype)
        return StaticEagle3Drafter(loaded.model, loaded.feature_layers, mode.cuda_graphs, max_len), loaded
    from draftlab.serve.eagle3_drafter import Eagle3Drafter

    return Eagle3Drafter.from_folder(folder, target_model, rules, dtype)


def graph_report(*parts) -> dict[str, str]:
    """Each fixed-shape step of the runners/drafters given: 'graph', 'eager', or why its capture failed."""
    report = {}
    for part in parts:
        report.update(getattr(part, "graph_report", dict)())
    return report

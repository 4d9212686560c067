"""Which target layers feed the draft (`extract.layers`), decided before any weights are loaded.

Layer ids are the ids the draft's config hands SGLang; which hidden states they name is the target architecture's
capture contract (draftlab.sglang.capture). On Llama (and SpecForge) id k is the output of decoder layer k = HF
`hidden_states[k+1]`; DeepSeek-V2/V3 adds the 1 only when the first id is 1. SGLang captures the residual stream
*entering* a layer, so on most architectures the last layer's output can never be captured: `last` exists only as a
one-layer ablation that SGLang cannot serve. HF's `hidden_states[L]` is the *normed* final state, while capture point
L here is the raw, pre-norm output of the last decoder layer (a forward hook on `layers[L-1]`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from draftlab.config.config import ConfigError, check_layers_spec
from draftlab.sglang.capture import ArchCapture, for_target, llama

log = logging.getLogger("draftlab.layers")

CONVENTION = "sglang: capture point c = the residual stream entering decoder layer c = HF hidden_states[c]"
LAST_WARNING = (
    "extract.layers=last is the one-layer ablation: SGLang's Llama targets never capture the last layer's output, "
    "so a draft trained on it cannot be served by SGLang"
)


def spec_name(spec: Any) -> str:
    """`auto`, `last` or `explicit`: recorded in the manifest so the ablation is never mistaken for a servable draft."""
    return spec if isinstance(spec, str) else "explicit"


def sglang_servable(spec: Any) -> bool:
    return spec_name(spec) != "last"


def resolve_layers(spec: Any, num_layers: int, capture: ArchCapture | None = None) -> list[int]:
    """The ascending layer ids for `extract.layers` on the target whose SGLang capture contract is `capture`
    (Llama's when None); raises ConfigError naming the key for ids SGLang would not capture."""
    check_layers_spec(spec)
    capture = capture or llama()
    L = int(num_layers)
    if spec == "last":
        log.warning(LAST_WARNING)
        return [L - 1]
    if spec == "auto":
        if L < 7:  # below 7 layers the default ids collide or go negative
            raise ConfigError(f"extract.layers: auto needs a target with >= 7 layers, this one has {L}; list the ids")
        return capture.default_ids(L)
    ids = [int(i) for i in spec]
    top = capture.top(L)
    points = capture.points(ids, L)
    if L - 1 in ids and points[ids.index(L - 1)] == L > top:
        raise ConfigError(
            f"extract.layers: id {L - 1} is the last layer's output, which SGLang's {capture.arch} targets cannot "
            f"capture (only ids 0..{L - 2}); use extract.layers=last for the one-layer ablation")
    outside = [i for i, c in zip(ids, points) if c > top]
    if outside:
        raise ConfigError(f"extract.layers: ids {outside} are outside the target's {L} layers (SGLang {capture.version}"
                          f" captures points 0..{top} on {capture.arch}, ids rule {capture.rule})")
    return ids


def capture_points(spec: Any, ids: list[int], num_layers: int, capture: ArchCapture | None = None) -> list[int]:
    """Where the features for `ids` are read: the residual stream entering layer c (c = L: the last layer's
    output before the final norm). `last` is the ablation's last layer output whatever the architecture."""
    if spec_name(spec) == "last":
        return [int(num_layers)]
    return (capture or llama()).points(ids, num_layers)


def target_capture(target_cfg, sglang_version: str | None = None) -> ArchCapture:
    """The configured target's capture contract under SGLang `sglang_version` (serve.sglang_version; None: see
    capture.resolve_version), from its config.json alone (no weights)."""
    from draftlab.target.target_shape import target_config_json

    return for_target(target_config_json(target_cfg), allow_unlisted=bool(target_cfg.get("allow_unlisted_arch")),
                      version=sglang_version)


def num_target_layers(target_cfg, cache_dir: Path | str | None = None) -> int:
    """The target's layer count without loading weights (see draftlab.target.target_shape)."""
    from draftlab.target.target_shape import target_shape

    return int(target_shape(target_cfg)["num_hidden_layers"])

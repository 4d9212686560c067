"""Which target layers feed the draft (`extract.layers`), decided before any weights are loaded.

Convention (SGLang's llama.py, SpecForge): layer id k = the output of decoder layer k (0-based) = HF
`hidden_states[k+1]` for k < L-1. SGLang captures the residual stream *entering* layer k+1, so the output of the
last layer (k = L-1) can never be captured there: `last` exists only as a one-layer ablation that SGLang cannot serve.
Note that HF's `hidden_states[L]` is the *normed* final state (transformers ties it to `last_hidden_state`), while
id L-1 here is the raw, pre-norm output of the last decoder layer (a forward hook on `layers[L-1]`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from draftlab.config import ConfigError, check_layers_spec

log = logging.getLogger("draftlab.layers")

CONVENTION = "sglang-llama: id k = output of decoder layer k (0-based) = HF hidden_states[k+1]"
LAST_WARNING = (
    "extract.layers=last is the one-layer ablation: SGLang's Llama targets never capture the last layer's output, "
    "so a draft trained on it cannot be served by SGLang"
)


def spec_name(spec: Any) -> str:
    """`auto`, `last` or `explicit`: recorded in the manifest so the ablation is never mistaken for a servable draft."""
    return spec if isinstance(spec, str) else "explicit"


def sglang_servable(spec: Any) -> bool:
    return spec_name(spec) != "last"


def resolve_layers(spec: Any, num_layers: int) -> list[int]:
    """The ascending layer ids for `extract.layers`; raises ConfigError naming the key for anything SGLang can't use."""
    check_layers_spec(spec)
    L = int(num_layers)
    if spec == "last":
        log.warning(LAST_WARNING)
        return [L - 1]
    if spec == "auto":
        ids = [1, L // 2 - 1, L - 4]
        if L < 7:  # below 7 layers the default ids collide or go negative
            raise ConfigError(f"extract.layers: auto needs a target with >= 7 layers, this one has {L}; list the ids")
        return ids
    ids = [int(i) for i in spec]
    outside = [i for i in ids if i >= L]
    if outside:
        raise ConfigError(f"extract.layers: ids {outside} are outside the target's {L} layers (valid 0..{L - 2})")
    if L - 1 in ids:
        raise ConfigError(
            f"extract.layers: id {L - 1} is the last layer's output, which SGLang's Llama targets cannot capture "
            f"(only ids 0..{L - 2}); use extract.layers=last for the one-layer ablation"
        )
    return ids


def num_target_layers(target_cfg, cache_dir: Path | str | None = None) -> int:
    """The target's layer count without loading weights (see draftlab.target.target_shape)."""
    from draftlab.target_shape import target_shape

    return int(target_shape(target_cfg)["num_hidden_layers"])

"""The target with a static KV cache: preallocated to the longest request, so verify and decode steps have fixed
shapes and can run as CUDA graphs (serve/cuda_graphs.py). Same interface as engine.TargetRunner.

The cache is transformers' StaticCache with one change (`SlotCache`): a forward writes its keys and values to
the slots named by a device tensor (`slots` = the positions of its tokens), not after a running count. Rolling
back after a verification is then host bookkeeping only (`length`): the rejected drafts' entries stay in their
slots, invisible, and the next step overwrites them. Visibility comes from the 4D mask we pass (query at position
p sees slots 0..p), which transformers uses as given; the stale slots > p are masked. Every step reads its base
position from a device scalar and derives slots, rope positions and mask from it inside the step, so a captured
graph replays correctly at any position. Prefills (variable length) run eagerly on the same cache.
"""

from __future__ import annotations

import inspect
import logging
from typing import Sequence

import torch

from draftlab.serve.batch_cache import row_mask
from draftlab.serve.cuda_graphs import StepGraph

log = logging.getLogger("draftlab.serve")
LENGTH_QUANTUM = 256  # cache lengths are rounded up to this, so requests of similar size share captured graphs


def cache_length(tokens: int) -> int:
    """The static cache length that holds `tokens` positions: a multiple of LENGTH_QUANTUM, at least one."""
    return max(LENGTH_QUANTUM, -(-tokens // LENGTH_QUANTUM) * LENGTH_QUANTUM)


def _slots(base: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Cache slots (= rope positions) of a step's tokens: base, base+1, ... (a function so a test can break it)."""
    return base + steps


def visible_mask(slots: torch.Tensor, max_len: int, additive_dtype: torch.dtype | None) -> torch.Tensor:
    """[1, 1, T, max_len]: the query at position p sees slots 0..p (one request: the batch's row mask of one row)."""
    return row_mask(slots[None], max_len, additive_dtype)


def _full_attention_only(config) -> bool:
    """Our mask is plain causal over all slots: right for full-attention layers only."""
    types = getattr(config, "layer_types", None)
    if types:
        return all(t == "full_attention" for t in types)
    return not getattr(config, "sliding_window", None) or getattr(config, "use_sliding_window", True) is False


def _attention(config) -> str:
    return getattr(config, "_attn_implementation", None) or "sdpa"


def static_cache_obstacle(config) -> str | None:
    """Why the static cache cannot serve a target of this config, or None: it masks full causal attention only
    and passes its own 4D mask, which only sdpa and eager attention take as given."""
    if not _full_attention_only(config):
        return "the target has sliding-window layers"
    if _attention(config) not in ("sdpa", "eager"):
        return f"the target's attention is {_attention(config)} (the static cache needs sdpa or eager)"
    return None


def _slot_cache_class():
    from transformers import StaticCache

    class SlotCache(StaticCache):
        """StaticCache whose `update` writes to `self.slots` (set before each forward) and keeps the whole buffer."""

        def __init__(self, config, max_cache_len: int):
            super().__init__(config=config, max_cache_len=max_cache_len)
            self.max_len = max_cache_len
            self.slots: torch.Tensor | None = None
            self.span = max_cache_len  # attention reads slots 0..span-1 (less than all only in eager steps)
            self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            self.host_length = 0

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if layer_idx not in self.kv:  # allocated once, at the first (eager) prefill
                shape = (key_states.shape[0], key_states.shape[1], self.max_len)
                self.kv[layer_idx] = (key_states.new_zeros(*shape, key_states.shape[-1]),
                                      value_states.new_zeros(*shape, value_states.shape[-1]))
            keys, values = self.kv[layer_idx]
            keys.index_copy_(2, self.slots, key_states)
            values.index_copy_(2, self.slots, value_states)
            return keys[:, :, : self.span], values[:, :, : self.span]

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return self.host_length

    return SlotCache


class StaticTargetRunner:
    """engine.TargetRunner's interface over a SlotCache; steps of a fixed token count become StepGraphs."""

    def __init__(self, model, feature_layers: Sequence[int] = (), graphs: bool = False, max_len: int = 0):
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.feature_layers = tuple(feature_layers)
        num_layers = model.config.num_hidden_layers
        if any(not 0 <= k < num_layers for k in self.feature_layers):
            raise ValueError(f"feature layers {self.feature_layers} outside the target's 0..{num_layers - 1}")
        why = static_cache_obstacle(model.config)
        if why:
            raise ValueError(f"the static KV cache cannot serve this target: {why} (bench.static_cache=false serves "
                             "it with the dynamic cache)")
        self._additive = None if _attention(model.config) == "sdpa" else self.dtype
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = "logits_to_keep" if "logits_to_keep" in params else None
        # a forward that takes cache_position gets it explicitly, so nothing is derived on the host from the cache's
        # length (Llama's takes none in transformers 5.17 or 5.24; other architectures may)
        self._position_kw = "cache_position" in params
        self.graphs = graphs
        self.cache = None
        self._steps: dict[tuple[int, bool], tuple[StepGraph, torch.Tensor]] = {}
        self._base = torch.zeros((), dtype=torch.long, device=self.device)
        self.reserve(max_len)

    def reserve(self, tokens: int) -> None:
        """Makes room for `tokens` positions; a larger cache means new buffers, so captured steps are dropped."""
        if self.cache is not None and tokens <= self.cache.max_len:
            return
        size = cache_length(tokens)
        if self._steps:
            log.info("static KV cache grows to %d positions: its CUDA graphs are captured again", size)
        self.cache = _slot_cache_class()(self.model.config, size)
        self._steps = {}

    def reset(self) -> None:
        self.length = 0  # old entries stay in their slots, masked until overwritten

    @property
    def length(self) -> int:
        """Positions in use; kept on the cache, whose get_seq_length reports it."""
        return self.cache.host_length

    @length.setter
    def length(self, value: int) -> None:
        self.cache.host_length = value

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    def _span(self, count: int) -> int | None:
        """Slots an eager step attends over: the used ones (cheaper, same result); a graph needs them all."""
        return None if self.graphs else self.length + count

    def _run(self, ids: torch.Tensor, slots: torch.Tensor, want_features: bool, keep_last: bool,
             span: int | None = None):
        span = span or self.cache.max_len
        self.cache.slots, self.cache.span = slots, span
        kwargs = {self._cache_kw: self.cache}
        if keep_last and self._keep_kw:
            kwargs[self._keep_kw] = 1
        if self._position_kw:
            kwargs["cache_position"] = slots
        out = self.model(input_ids=ids[None], position_ids=slots[None], use_cache=True,
                         attention_mask=visible_mask(slots, span, self._additive),
                         output_hidden_states=want_features, **kwargs)
        logits = out.logits[0].float()
        if not (want_features and self.feature_layers):
            return (logits,)
        # hidden_states[0] is the embedding output, so layer k's output is hidden_states[k + 1]
        return logits, torch.cat([out.hidden_states[k + 1][0] for k in self.feature_layers], dim=-1)

    def _step(self, count: int, want_features: bool) -> tuple[StepGraph, torch.Tensor]:
        key = (count, want_features)
        if key not in self._steps:
            ids = torch.zeros(count, dtype=torch.long, device=self.device)
            steps = torch.arange(count, device=self.device)
            fn = lambda: self._run(ids, _slots(self._base, steps), want_features, False,  # noqa: E731
                                   self._span(count))
            step = StepGraph(fn, f"target step of {count} token(s)", self.graphs, self.device)
            self._steps[key] = (step, ids)
        return self._steps[key]

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, want_features: bool, last_only: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids [T] written at positions length.. -> (logits [T, V] float32 ([1, V] if last_only), features)."""
        count = int(ids.numel())
        if self.length + count > self.cache.max_len:
            raise RuntimeError(f"static KV cache full: {self.length} + {count} > {self.cache.max_len} positions "
                               "(reserve() the request's length first)")
        if last_only:  # a prefill: any length, eager, one row of logits
            out = self._run(ids, torch.arange(self.length, self.length + count, device=self.device),
                            want_features, True, self.length + count)
        else:
            step, buffer = self._step(count, want_features)
            buffer.copy_(ids)
            self._base.fill_(self.length)
            out = step()
        self.length += count
        return out[0], (out[1] if len(out) > 1 else None)

    def crop(self, keep: int) -> None:
        if keep > self.length:
            raise RuntimeError(f"cannot grow a KV cache by cropping ({self.length} -> {keep})")
        self.length = keep

    def graph_report(self) -> dict[str, str]:
        """Each step's state: captured, eager, or why its capture failed."""
        return {g.name: g.state for g, _ in self._steps.values()}

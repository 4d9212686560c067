"""KV caches for a batch of requests, each row at its own position: the static caches' slot scheme, per row.

serve/static_target.py and draft_cache.py write a step's keys and values to the slots named by one device
tensor and mask "the query at position p sees slots 0..p". Here `slots` is [B, T], one row of positions per
request, so rows of different prompt lengths and accept histories share one forward: a row's slots past its
committed length hold padding, rejected drafts or a finished row's junk, masked until that row overwrites them
(every step writes its slots before its queries read them). The rope positions are the slots too, so padding and
per-row positions leave each row's arithmetic what it would be alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from draftlab.model.draft import _repeat_kv


def row_slots(base: Tensor, count: int) -> Tensor:
    """[B, count]: the slots (= rope positions) of a step's tokens, row b from base[b] on (a function so a test
    can break it)."""
    return base[:, None] + torch.arange(count, device=base.device)[None, :]


def row_mask(slots: Tensor, span: int, additive_dtype: torch.dtype | None) -> Tensor:
    """[B, 1, T, span]: the query at position p sees slots 0..p of its own row. Boolean for SDPA, else additive."""
    allowed = torch.arange(span, device=slots.device)[None, None, :] <= slots[:, :, None]
    if additive_dtype is None:
        return allowed[:, None]
    zero = torch.zeros((), dtype=additive_dtype, device=slots.device)
    return torch.where(allowed, zero, torch.finfo(additive_dtype).min)[:, None]


def write_rows(buffer: Tensor, slots: Tensor, new: Tensor) -> None:
    """buffer [B, H, L, D] gets new [B, H, T, D] at slots [B, T] of each row."""
    index = slots[:, None, :, None].expand(-1, new.shape[1], -1, new.shape[3])
    buffer.scatter_(2, index, new.to(buffer.dtype))


def row_slot_cache_class():
    """transformers' StaticCache whose `update` writes each row to its own `slots` and returns slots 0..span-1."""
    from transformers import StaticCache

    class RowSlotCache(StaticCache):
        def __init__(self, config, max_cache_len: int):
            super().__init__(config=config, max_cache_len=max_cache_len)
            self.max_len = max_cache_len
            self.slots: Tensor | None = None  # [B, T], set before each forward
            self.span = max_cache_len
            self.kv: dict[int, tuple[Tensor, Tensor]] = {}

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if layer_idx not in self.kv:  # allocated at the first forward (the prefill), at its batch size
                shape = (key_states.shape[0], key_states.shape[1], self.max_len)
                self.kv[layer_idx] = (key_states.new_zeros(*shape, key_states.shape[-1]),
                                      value_states.new_zeros(*shape, value_states.shape[-1]))
            keys, values = self.kv[layer_idx]
            write_rows(keys, self.slots, key_states)
            write_rows(values, self.slots, value_states)
            return keys[:, :, : self.span], values[:, :, : self.span]

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return 0  # positions come from position_ids and the mask we pass, never from a running count

    return RowSlotCache


class RowKVCache:
    """The draft's cache (model/draft.py's `attend` contract) with per-row slots [B, T]."""

    def __init__(self, num_layers: int, max_len: int) -> None:
        self.max_len = max_len
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers
        self.slots: Tensor | None = None
        self.span: int | None = None
        self._mask: tuple[Tensor, Tensor] | None = None  # built once per forward, shared by the layers

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.keys[layer] is None:
            B, H, _, D = k.shape
            self.keys[layer] = k.new_zeros(B, H, self.max_len, D)
            self.values[layer] = v.new_zeros(B, H, self.max_len, D)
        write_rows(self.keys[layer], self.slots, k)
        write_rows(self.values[layer], self.slots, v)
        span = self.span or self.max_len
        keys, values = self.keys[layer][:, :, :span], self.values[layer][:, :, :span]
        if self._mask is None or self._mask[0] is not self.slots:
            self._mask = (self.slots, row_mask(self.slots, span, None))
        n_rep = q.shape[1] // keys.shape[1]
        return F.scaled_dot_product_attention(q, _repeat_kv(keys, n_rep), _repeat_kv(values, n_rep),
                                              attn_mask=self._mask[1])

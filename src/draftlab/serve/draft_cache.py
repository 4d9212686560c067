"""A preallocated KV cache for the EAGLE-3 draft: model/draft.py's `KVCache.attend` contract, fixed shapes.

`KVCache` concatenates (shapes grow every step); this one holds [B, n_kv, max_len, head_dim] per layer from the
first call on, writes a forward's keys/values to `slots` (a device tensor the drafter sets before each forward:
the tokens' rope positions, which are also their cache slots) and attends over the whole buffer under a mask:
the query at position p sees slots 0..p. That is what `KVCache` gives (everything cached, causal among the new
tokens) as long as slots 0..p hold this request's entries, which the drafter's bookkeeping guarantees: slots past
the committed length hold drafted or padding entries that are masked until a later step overwrites them.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from draftlab.model.draft import _repeat_kv
from draftlab.serve.static_target import visible_mask


def visible(slots: Tensor, max_len: int) -> Tensor:
    """[1, 1, T, max_len] boolean: the target's mask (the query at position p sees slots 0..p), named here so a
    test can break the draft's alone."""
    return visible_mask(slots, max_len, None)


class StaticKVCache:
    def __init__(self, num_layers: int, max_len: int) -> None:
        self.max_len = max_len
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers
        self.slots: Tensor | None = None  # [T] long, set before each forward
        self.span: int | None = None  # attend over slots 0..span-1 (None: all; eager steps use fewer, same result)
        self._mask: tuple[Tensor, Tensor] | None = None  # (slots it was built for, mask): once per forward

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.keys[layer] is None:
            B, H, _, D = k.shape
            self.keys[layer] = k.new_zeros(B, H, self.max_len, D)
            self.values[layer] = v.new_zeros(B, H, self.max_len, D)
        keys, values = self.keys[layer], self.values[layer]
        keys.index_copy_(2, self.slots, k)
        values.index_copy_(2, self.slots, v)
        span = self.span or self.max_len
        keys, values = keys[:, :, :span], values[:, :, :span]
        if self._mask is None or self._mask[0] is not self.slots:
            self._mask = (self.slots, visible(self.slots, span))
        n_rep = q.shape[1] // keys.shape[1]
        return F.scaled_dot_product_attention(q, _repeat_kv(keys, n_rep), _repeat_kv(values, n_rep),
                                              attn_mask=self._mask[1])

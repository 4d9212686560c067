"""The decode step of `data.generator=graphs`: B slots (rows), one token per slot per step, every shape fixed, so the
whole step is captured once as a CUDA graph and replayed.

Why a graph: for SmolLM2 (135M) at batch 512 a decode step is over a thousand small kernels. Launched one by one
from Python they take ~25 ms; replayed as one graph they cost what the GPU needs (a few ms: the
KV cache read and the kernels themselves).

The cache is a ring of C columns shared by all slots, one key and one value tensor per layer, kept here (not in a
transformers Cache): step t writes column t mod C for every slot; each slot has its own RoPE position and its own
additive mask row (0 = visible, dtype min = hidden), so a slot can start a new prompt at any step: its prompt's
keys/values are copied into the C columns just before the current one and the rest of its mask row is hidden. A
slot needs its prompt plus its answer, less one token, in the ring: C covers `width + max_new_tokens`. Keys are
stored after RoPE, so where a token sits in the ring changes nothing but the order of the attention sums.

During a step each attention module carries its layer's ring (`RING`); `_attention` writes the new key/value there
and attends over it, so no layer reads its index. That is what lets `compile` build one decoder layer and reuse it
for all of them (torch.compile's regional compilation: one layer's trace instead of the whole model's, which cost
24 s cold on the H200); the embedding, the final norm and the head stay eager.

Nothing in `step` reads a value back to the host (tests/unit/test_fastgen.py checks the ops it dispatches), so it can be
captured; on the CPU, or when capture fails, the same `step` runs eagerly, with a log line saying so.
"""

from __future__ import annotations

import inspect
import logging
import sys
import time
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F

from draftlab.model.attention import variable_shape_attention
from draftlab.serve.cuda_graphs import recover, refuse_after_a_broken_capture, warm_up_and_capture

log = logging.getLogger("draftlab.generate")

RING = "_draftlab_slot_ring"  # the attribute that carries a layer's ring (keys, values, column) during a step
ALIGN = 16            # cache columns: SDPA's memory-efficient kernel wants the mask's last dim a multiple of 16
PREFILL_TOKENS = 65_536  # prompt tokens (padded) per prefill forward: bounds its activations and attention mask
WARMUP_STEPS = 3      # eager steps on a side stream before capture (cuBLAS and allocator set-up happen there)


def cache_columns(width: int, max_new_tokens: int) -> int:
    return -(-(width + max_new_tokens) // ALIGN) * ALIGN


class DecodeSlots:
    """Static buffers for `batch` slots; `step` decodes one token in each; `load` starts prompts in given slots."""

    def __init__(self, model, batch: int, columns: int, max_new_tokens: int, eos_ids: list[int], pad_id: int,
                 compile: bool = False):
        from transformers import DynamicCache

        self.model, self.batch, self.columns, self.max_new = model, batch, columns, max_new_tokens
        self.pad_id, self._dynamic_cache = pad_id, DynamicCache
        config = model.config
        param = next(model.parameters())
        device, dtype = param.device, param.dtype
        self.device, self.dtype, self.hidden = device, dtype, torch.finfo(dtype).min
        self.layers = _decoder_layers(model, columns)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        ring = (batch, kv_heads, columns, head_dim)
        self.keys = [torch.zeros(ring, dtype=dtype, device=device) for _ in self.layers]
        self.values = [torch.zeros(ring, dtype=dtype, device=device) for _ in self.layers]
        # the prefill's DynamicCache goes in as `cache` (transformers 5.24) or `past_key_values` (5.17)
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        long = {"dtype": torch.long, "device": device}
        self.tokens = torch.zeros(batch, 1, **long)       # the token each slot feeds next
        self.positions = torch.zeros(batch, 1, **long)    # its RoPE position
        self.column = torch.zeros(1, **long)              # the ring column this step writes
        self.lengths = torch.zeros(batch, **long)         # answer tokens so far
        self.out = torch.zeros(batch, max_new_tokens + 1, **long)  # answers; the last column takes done slots' junk
        self.done = torch.ones(batch, dtype=torch.bool, device=device)
        self.mask = torch.full((batch, 1, 1, columns), self.hidden, dtype=dtype, device=device)
        self.eos = torch.tensor(sorted(set(eos_ids)), **long)
        self.steps = 0  # steps taken (host count): the ring column is steps % columns
        self.graph = None
        # optional: inductor fuses each layer's small kernels (norms, RoPE, SiLU, residuals) before capture; one
        # compiled forward per decoder layer class, shared by its layers (they differ only in their weights and ring)
        self.layer_forward = ({cls: torch.compile(cls.forward, dynamic=False) for cls in {type(l) for l in self.layers}}
                              if compile else {})
        self.key: tuple = ()  # what its owner built it for (graphgen reuses it while that stays the same)
        self.compile_seconds, self.compile_cached = 0.0, False  # set by compile_step

    @property
    def compiled(self) -> bool:
        """Whether the step runs compiled layers (False after a failed compile)."""
        return bool(self.layer_forward)

    @contextmanager
    def _rings(self):
        """For one forward: every layer's attention module carries its ring, and with `compile` every decoder layer
        runs its class's compiled forward. Both are taken off afterwards, so the prefill is the model's own."""
        try:
            for layer, keys, values in zip(self.layers, self.keys, self.values):
                setattr(layer.self_attn, RING, (keys, values, self.column))
                if self.layer_forward:
                    layer.forward = partial(self.layer_forward[type(layer)], layer)
            yield
        finally:  # (also after an interrupt half-way through the loop above)
            for layer in self.layers:
                vars(layer.self_attn).pop(RING, None)
                vars(layer).pop("forward", None)

    def step(self) -> None:
        """One token for every slot, on device tensors only (capturable). Done slots compute junk that is never read."""
        self.mask.index_fill_(3, self.column, 0.0)  # the column written now is visible to its own query
        with self._rings():  # no transformers cache: each layer's attention writes and reads its ring
            logits = self.model(input_ids=self.tokens, position_ids=self.positions, attention_mask=self.mask,
                                use_cache=False, logits_to_keep=1).logits
        token = logits[:, -1].argmax(-1)
        live = (~self.done).long()
        self.out.scatter_(1, self.lengths[:, None], token[:, None])
        self.lengths.add_(live)
        ended = (token[:, None] == self.eos[None, :]).any(-1) | (self.lengths >= self.max_new)
        self.done.logical_or_(ended)
        self.tokens.copy_(token[:, None])
        self.positions.add_(live[:, None])
        self.column.add_(1).remainder_(self.columns)

    def capture(self) -> None:
        """Records `step` as a CUDA graph; on failure (or on the CPU) `advance` runs it eagerly instead."""
        if self.compiled:
            self.compile_step()
        if self.device.type != "cuda":
            log.info("generate: graphs: %s device, so the decode step runs eagerly (CUDA graphs need a GPU)",
                     self.device.type)
            return
        stream = torch.cuda.current_stream(self.device)
        try:
            refuse_after_a_broken_capture()  # (torch < 2.12 cannot capture again after a failed capture)
            with torch.cuda.device(self.device):  # a capture records the kernels of its own device's stream only
                graph, _, _ = warm_up_and_capture(self.step, WARMUP_STEPS)
                column = int(self.column)
                graph.replay()  # one step from here must move the ring on: an empty graph would decode forever
                if int(self.column) != (column + 1) % self.columns:
                    raise RuntimeError("the captured step replays nothing (captured on another device or stream?)")
            self.graph = graph
            log.info("generate: graphs: decode step captured as a CUDA graph (%d slots x %d cache columns)",
                     self.batch, self.columns)
        except Exception as error:  # any capture failure: the eager step gives the same answers, only slower
            torch.cuda.set_stream(stream)
            recover(self.device)
            self.graph = None
            log.warning("generate: graphs: CUDA graph capture failed (%s: %s); decoding EAGERLY, one launch per "
                        "kernel (slow)", type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        self.reset()

    def compile_step(self) -> None:
        """Compiles now (first call), so that a failure falls back to the plain step instead of failing the run.
        Sets `compile_seconds` and `compile_cached`: whether the graph came from torch.compile's on-disk cache (an
        earlier run's, or the decode warm-up's: draftlab/warmup/decode.py)."""
        started, before = time.perf_counter(), _compile_cache_counts()
        try:
            self.step()
            self.compile_seconds = time.perf_counter() - started
            hits, misses = (after - was for after, was in zip(_compile_cache_counts(), before))
            self.compile_cached = hits > 0 and misses == 0
            log.info("generate: graphs: torch.compile built the decode step in %.1f s%s", self.compile_seconds,
                     " (from the compile cache)" if self.compile_cached else "")
        except Exception as error:  # any compile failure: the uncompiled step gives the same answers
            self.layer_forward = {}
            log.warning("generate: graphs: torch.compile of the decode step failed (%s: %s); using it uncompiled",
                        type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        self.reset()

    def reset(self) -> None:
        """Every slot free; cache contents stay (hidden by the mask, finite, overwritten when a slot is loaded)."""
        for buffer in (self.tokens, self.positions, self.column, self.lengths):
            buffer.zero_()
        self.done.fill_(True)
        self.mask.fill_(self.hidden)
        self.steps = 0

    def advance(self, steps: int) -> None:
        for _ in range(steps):
            if self.graph is not None:
                self.graph.replay()
            else:
                self.step()
        self.steps += steps

    def load(self, slots: list[int], prompts: list[list[int]]) -> None:
        """Starts each prompt in its slot: an eager prefill (left padded, in chunks) gives its first token and its
        keys/values, which are copied into the ring columns just before the next step's."""
        width = max(len(p) for p in prompts)
        rows = max(1, PREFILL_TOKENS // width)
        for start in range(0, len(prompts), rows):
            self._load(slots[start:start + rows], prompts[start:start + rows])

    def _load(self, slots: list[int], prompts: list[list[int]]) -> None:
        n, width, device = len(prompts), max(len(p) for p in prompts), self.device
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        real = torch.zeros((n, width), dtype=torch.bool)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt):] = torch.tensor(prompt)
            real[i, width - len(prompt):] = True
        positions = (real.long().cumsum(-1) - 1).clamp(min=0)  # what HF generate gives left-padded rows
        # query w sees key w' <= w when w' is a prompt token; pad queries see nothing (a finite, unused result)
        seen = torch.ones(width, width, dtype=torch.bool).tril()[None] & real[:, None, :]
        mask = torch.zeros((n, 1, width, width), dtype=self.dtype).masked_fill_(~seen[:, None], self.hidden)
        prefill = self._dynamic_cache(config=self.model.config)
        # every prefill has another padded width: cuDNN's attention would plan each one on the host (model/attention.py)
        with variable_shape_attention():
            logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                                position_ids=positions.to(device), use_cache=True, logits_to_keep=1,
                                **{self.cache_arg: prefill}).logits[:, -1]
        first = logits.argmax(-1)
        # prompt token j of slot s goes to ring column (next - len + j) % C, next being the column of the next step
        nxt = self.steps % self.columns
        src_row, src_pos, dst_slot, dst_col = [], [], [], []
        for i, (slot, prompt) in enumerate(zip(slots, prompts)):
            count = len(prompt)
            src_row += [i] * count
            src_pos += range(width - count, width)
            dst_slot += [slot] * count
            dst_col += [(nxt - count + j) % self.columns for j in range(count)]
        src_row, src_pos, dst_slot, dst_col = (torch.tensor(x, device=device) for x in
                                               (src_row, src_pos, dst_slot, dst_col))
        for keys, values, new in zip(self.keys, self.values, prefill.layers):
            keys[dst_slot, :, dst_col] = new.keys[src_row, :, src_pos]
            values[dst_slot, :, dst_col] = new.values[src_row, :, src_pos]
        index = torch.tensor(slots, device=device)
        self.mask[index] = self.hidden
        self.mask[dst_slot, 0, 0, dst_col] = 0.0
        self.tokens[index, 0] = first
        self.positions[index, 0] = torch.tensor([len(p) for p in prompts], device=device)
        self.out[index, 0] = first
        self.lengths[index] = 1
        self.done[index] = (first[:, None] == self.eos[None, :]).any(-1) | (self.max_new <= 1)

    def answers(self, slots: list[int]) -> list[list[int]]:
        index = torch.tensor(slots, device=self.device)
        rows, lengths = self.out[index].tolist(), self.lengths[index].tolist()
        return [row[:length] for row, length in zip(rows, lengths)]


def _compile_cache_counts() -> tuple[int, int]:
    """Lookups in torch.compile's on-disk caches (AOTAutograd's, Inductor's FX graph cache) so far: hits, misses."""
    from torch._dynamo.utils import counters

    aot, inductor = counters["aot_autograd"], counters["inductor"]
    return (aot["autograd_cache_hit"] + inductor["fxgraph_cache_hit"],
            aot["autograd_cache_miss"] + inductor["fxgraph_cache_miss"])


def _decoder_layers(model, columns: int) -> list:
    """The decoder layers whose attention the step serves; refuses models it cannot (a sliding-window layer would
    need another mask, and the ring needs `layers[i].self_attn`)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    if any(type(layer) is not StaticLayer for layer in StaticCache(config=model.config, max_cache_len=columns).layers):
        raise NotImplementedError("data.generator=graphs: needs a decoder whose every layer is full attention "
                                  "(transformers StaticLayer); use data.generator=static or plain")
    layers = list(getattr(model.get_decoder(), "layers", []))[:model.config.num_hidden_layers]
    if not layers or not all(hasattr(layer, "self_attn") for layer in layers) or \
            any("forward" in vars(layer) for layer in layers):  # (a hooked layer's own forward would be lost)
        raise NotImplementedError(f"data.generator=graphs: needs decoder layers with a `self_attn` and their class's "
                                  f"forward ({type(model).__name__}); use data.generator=static or plain")
    return layers


def _attention(module, query, key, value, attention_mask, *args, prefill: str = "eager", **kwargs):
    """In a decode step (the module carries its ring): writes the new key/value at the step's column, then the query
    heads sharing a key/value head attend together over the ring (no repeated keys/values), with the slots'
    additive mask. Any other call (the prefill) goes to the model's own attention, `prefill`."""
    ring = getattr(module, RING, None)
    if ring is None:
        if prefill == "eager":  # each transformers model file defines its own eager attention
            own = sys.modules[type(module).__module__].eager_attention_forward
        else:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            own = ALL_ATTENTION_FUNCTIONS[prefill]
        return own(module, query, key, value, attention_mask, *args, **kwargs)
    keys, values, column = ring
    keys.index_copy_(2, column, key)
    values.index_copy_(2, column, value)
    batch, heads, _, dim = query.shape
    grouped = query.reshape(batch, keys.shape[1], heads // keys.shape[1], dim)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=attention_mask, scale=kwargs.get("scaling"))
    return out.reshape(batch, 1, heads, dim), None


@contextmanager
def slot_attention(model):
    """Switches the model to `_attention` and back afterwards. The prefill keeps the model's eager or sdpa on a CPU;
    on a GPU it takes SDPA (faster than eager). Our prefill mask is additive with the dtype's finite minimum, so a
    pad query that sees no key gives finite junk, never NaN: bf16 SDPA with it answers left-padded prompts right
    (checked on SmolLM2 on the CPU, where HF's own padding mask gave garbage: stack-notes 3)."""
    from transformers import AttentionInterface

    own = model.config._attn_implementation
    if own not in ("eager", "sdpa"):
        raise NotImplementedError(f"data.generator=graphs: attention {own!r} is not supported (eager or sdpa)")
    prefill = "sdpa" if next(model.parameters()).device.type == "cuda" else own
    name = f"draftlab_slots_{prefill}"
    AttentionInterface.register(name, partial(_attention, prefill=prefill))
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(own)

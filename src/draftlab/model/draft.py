"""The EAGLE-3 draft: one Llama-style decoder layer (or more) over fused target features, in one readable file.

Parameter names are the checkpoint keys SGLang's `LlamaForCausalLMEagle3` loads (it adds the `model.` prefix
itself and stacks q/k/v and gate/up), so `state_dict()` is the export. The graph follows SGLang exactly:
- `fc` projects the concatenated target features, but only when the incoming width differs from hidden_size
  (SGLang's rule; at later draft steps the draft's own hidden state goes in unprojected);
- layer 0 attends over cat[input_layernorm(embedding), hidden_norm(hidden)] (embedding first) and its residual
  is the projected hidden; later layers are Llama layers whose pre-attention fused add+norm is also called
  `hidden_norm` (SGLang 0.5.23 reads `hidden_norm` there and never reads a later layer's input_layernorm);
- the final norm gives the normed state for the logits and the pre-norm sum as the next step's hidden state.

Two caches decide who attends to whom:
- `KVCache` (serving): new tokens attend to everything cached plus causally among themselves.
- `TTTCache` (training-time test): the first call is a causal pass over the sequence (step 0); call j attends
  to step-0 keys at positions <= t and to the keys of steps 1..j at position t only (ARCHITECTURE.md).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.bias import causal_lower_right


@dataclass
class DraftModelConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_hidden_size: int
    aux_layer_ids: list[int] = field(default_factory=list)  # num_aux = len(aux_layer_ids)
    vocab_size: int = 0
    draft_vocab_size: int = 0
    num_hidden_layers: int = 1
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    def to_hf_config(self, torch_dtype: str) -> dict:
        """The config.json SGLang reads for LlamaForCausalLMEagle3 (sglang-eagle3.md section 2.1)."""
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": self.num_hidden_layers,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,  # the draft uses plain RoPE in training, so serving must too
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": self.hidden_act,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,  # true would make SGLang use embed rows as the head (a silent τ≈1)
            "torch_dtype": torch_dtype,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                             "use_aux_hidden_state": True},
        }

    @classmethod
    def from_hf_config(cls, d: dict) -> "DraftModelConfig":
        heads = d["num_attention_heads"]
        rope = d.get("rope_parameters") or {}
        ids = (d.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if ids is None:
            ids = d.get("eagle_aux_hidden_state_layer_ids") or [0, 1, 2]  # SGLang counts 3 aux states by default
        return cls(
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            target_hidden_size=d.get("target_hidden_size") or d["hidden_size"],
            aux_layer_ids=list(ids),
            vocab_size=d["vocab_size"],
            draft_vocab_size=d.get("draft_vocab_size") or d["vocab_size"],
            num_hidden_layers=d.get("num_hidden_layers", 1),
            rms_norm_eps=d.get("rms_norm_eps", 1e-5),
            rope_theta=d.get("rope_theta") or rope.get("rope_theta", 10000.0),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            hidden_act=d.get("hidden_act", "silu"),
        )

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------------------------------------
# attention primitives (all take q [B, H, T, D] and k, v [B, H_kv, S, D])


def _repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    # Explicit GQA expansion: the flash kernels behind causal_lower_right take equal head counts only.
    # x is [B, H_kv, ...]: the TTT diagonal keys come stacked as [B, H_kv, T, steps, D].
    if n_rep == 1:
        return x
    b, h, *rest = x.shape
    return x[:, :, None].expand(b, h, n_rep, *rest).reshape(b, h * n_rep, *rest)


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Query i sees keys 0..i + (S - T): plain causal when S == T, 'after a cached prefix' when S > T."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    T, S = q.shape[2], k.shape[2]
    if T == S:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if T == 1:
        return F.scaled_dot_product_attention(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(T, S))


def _build_null_keys(j: int, D: int, width: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """The j 'null' keys and values of `ttt_attention` ([j, D + width] each)."""
    null_k = torch.zeros(j, D + width, dtype=dtype, device=device)
    null_v = torch.zeros(j, D + width, dtype=dtype, device=device)
    idx = torch.arange(j, device=device)
    null_k[idx, D + 2 * idx] = 1
    null_k[idx, D + 2 * idx + 1] = 1
    null_v[idx, D + idx] = 1
    return null_k, null_v


@functools.cache
def _null_keys(j: int, D: int, width: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """`_build_null_keys`, built once per shape in eager code."""
    with torch.inference_mode(False):  # cached: must not be an inference tensor if first built under one
        return _build_null_keys(j, D, width, dtype, device)


def ttt_attention(q: Tensor, k0: Tensor, v0: Tensor, diag_k: list[Tensor], diag_v: list[Tensor]) -> Tensor:
    """Step j >= 1 of the unroll: query t attends to k0[<= t] and to diag_k[i][t] for every earlier step i.

    Done with one fused causal SDPA call and no [T, T*j] mask: each diagonal key becomes a 'null' key placed
    before the sequence, visible to every query. Its score, q_t . k_i[t], is precomputed per query and carried in
    extra q channels (as a bf16 hi + lo pair, so the rounding error stays ~2^-16), and its value is a one-hot
    extra channel, so the output's extra channel i is exactly the softmax weight p_i of that diagonal key under
    the full softmax. Then out = out[:D] + sum_i p_i v_i[t]. Gradients flow through the standard SDPA backward,
    so the result is exact attention under the rule.

    Host time matters here (a training step on a GPU waits on the host that queues it): the
    diagonal steps are stacked so the op count does not grow with j, and j zero queries go before the sequence
    so that plain square `is_causal` gives each real query the null keys and k0[<= t] (a `causal_lower_right`
    bias costs a tensor subclass's Python dispatch on every call).
    """
    B, H, T, D = q.shape
    j = len(diag_k)
    n_rep = H // k0.shape[1]
    dk = _repeat_kv(torch.stack(diag_k, 3), n_rep)  # [B, H, T, j, D]
    scores = (q.float()[:, :, :, None] * dk.float()).sum(-1)  # [B, H, T, j], fp32 under autocast too
    hi = scores.to(q.dtype)
    lo = (scores - hi.float()).to(q.dtype)
    width = -(-2 * j // 8) * 8  # flash kernels want head dims that are multiples of 8
    extra_q = torch.stack([hi, lo], -1).reshape(B, H, T, 2 * j)
    qx = torch.cat([q.new_zeros(B, H, j, D + width), torch.cat([q, F.pad(extra_q, (0, width - 2 * j))], -1)], 2)
    # under torch.compile the builder is traced (its zeros become constants of the graph), not its cache, and not
    # the cache's inference_mode switch: a graph holding that is never stored in AOTAutograd's cache, so every
    # process traced the forward and backward again (most of a warm compile)
    null_keys = _build_null_keys if torch.compiler.is_compiling() else _null_keys
    null_k, null_v = null_keys(j, D, width, q.dtype, q.device)
    kx = torch.cat([null_k.expand(B, H, j, D + width), F.pad(_repeat_kv(k0, n_rep), (0, width))], 2)
    vx = torch.cat([null_v.expand(B, H, j, D + width), F.pad(_repeat_kv(v0, n_rep), (0, width))], 2)
    out = F.scaled_dot_product_attention(qx, kx, vx, is_causal=True, scale=1 / math.sqrt(D))[:, :, j:]
    dv = _repeat_kv(torch.stack(diag_v, 3), n_rep)  # [B, H, T, j, D]
    return out[..., :D] + (out[..., D : D + j, None] * dv).sum(-2)


class KVCache:
    """Serving cache: per-layer keys/values [B, n_kv, S, head_dim]."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def crop(self, n: int) -> None:
        """Keeps the first n positions (drops drafted entries after a verification)."""
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is not None:
                self.keys[i], self.values[i] = k[:, :, :n], v[:, :, :n]

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], 2)
            v = torch.cat([self.values[layer], v], 2)
        self.keys[layer], self.values[layer] = k, v
        return causal_attention(q, k, v)


class TTTCache:
    """Training-time-test cache: the keys/values of every unroll step, per layer (see ttt_attention)."""

    def __init__(self, num_layers: int) -> None:
        self.steps: list[list[tuple[Tensor, Tensor]]] = [[] for _ in range(num_layers)]

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        steps = self.steps[layer]
        steps.append((k, v))
        if len(steps) == 1:
            return causal_attention(q, k, v)
        (k0, v0), rest = steps[0], steps[1:]
        return ttt_attention(q, k0, v0, [s[0] for s in rest], [s[1] for s in rest])


# ----------------------------------------------------------------------------------------------------------
# the model


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def _rotate_half(x: Tensor) -> Tensor:
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


class Attention(nn.Module):
    def __init__(self, cfg: DraftModelConfig, in_features: int) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(in_features, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(in_features, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(in_features, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache, layer: int) -> Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = (q * cos + _rotate_half(q) * sin).to(v.dtype)
        k = (k * cos + _rotate_half(k) * sin).to(v.dtype)
        y = causal_attention(q, k, v) if cache is None else cache.attend(layer, q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: DraftModelConfig) -> None:
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"hidden_act {cfg.hidden_act!r}: only silu is supported")
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DraftModelConfig, index: int) -> None:
        super().__init__()
        self.index = index
        H = cfg.hidden_size
        self.self_attn = Attention(cfg, 2 * H if index == 0 else H)
        self.mlp = MLP(cfg)
        if index == 0:  # only the input layer normalises the token embedding
            self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)

    def forward(self, x, residual, emb, cos, sin, cache) -> tuple[Tensor, Tensor]:
        if self.index == 0:  # the input layer: residual = projected hidden, attention over [emb; hidden]
            residual = x
            x = torch.cat([self.input_layernorm(emb), self.hidden_norm(x)], -1)
        else:  # a Llama layer: fused add + norm, the norm named as SGLang names it
            residual = x + residual
            x = self.hidden_norm(residual)
        x = self.self_attn(x, cos, sin, cache, self.index)
        residual = x + residual
        return self.mlp(self.post_attention_layernorm(residual)), residual


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: DraftModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)  # copied from the target and frozen
        self.fc = nn.Linear(cfg.num_aux * cfg.target_hidden_size, H, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def init_from_target(self, embed: Tensor, lm_head: Tensor | None, d2t: Tensor, t2d: Tensor,
                         freeze_head: bool = False) -> None:
        """Copies the target embedding and the vocab maps; seeds lm_head with the target head's draft-vocab rows
        when the widths agree (a better start than noise, as speculators does). freeze_head (train.freeze_lm_head)
        keeps those rows, as speculators does; it needs the copy."""
        if freeze_head and (lm_head is None or lm_head.shape[1] != self.cfg.hidden_size):
            raise ValueError(f"train.freeze_lm_head: the draft head is frozen at the target head's rows, which needs "
                             f"draft.hidden_size equal to the target's ({None if lm_head is None else lm_head.shape[1]}"
                             f"; the draft's is {self.cfg.hidden_size})")
        with torch.no_grad():
            self.d2t.copy_(d2t)
            self.t2d.copy_(t2d)
            if embed.shape == self.embed_tokens.weight.shape:
                self.embed_tokens.weight.copy_(embed)
            else:  # SGLang keeps the draft's own embedding when widths differ, so it must be trained
                self.embed_tokens.weight.requires_grad_(True)
            if lm_head is not None and lm_head.shape[1] == self.cfg.hidden_size:
                self.lm_head.weight.copy_(lm_head[self.draft_to_target(torch.arange(len(d2t)))])
        self.lm_head.weight.requires_grad_(not freeze_head)

    def draft_to_target(self, draft_ids: Tensor) -> Tensor:
        d2t = self.d2t.to(draft_ids.device)
        return draft_ids + d2t[draft_ids]

    def rope(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        # computed per call in fp32 (not a buffer): model.to(bfloat16) must not round the frequencies
        d = self.cfg.head_dim
        inv_freq = 1.0 / self.cfg.rope_theta ** (torch.arange(0, d, 2, device=position_ids.device).float() / d)
        freqs = position_ids.float()[..., None] * inv_freq
        emb = torch.cat([freqs, freqs], -1)[:, None]  # [B, 1, T, head_dim], broadcast over heads
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def step_inputs(self, input_ids: Tensor, hidden: Tensor,
                    position_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """What a draft step's layers read: (token embedding, hidden state in the model's width, rope cos, sin)."""
        emb = self.embed_tokens(input_ids)
        if not torch.is_autocast_enabled(hidden.device.type):
            hidden = hidden.to(self.fc.weight.dtype)
        if hidden.shape[-1] != self.cfg.hidden_size:  # raw target features: project (SGLang's width test)
            hidden = self.fc(hidden)
        cos, sin = self.rope(position_ids, torch.float32)
        return emb, hidden, cos, sin

    def forward(self, input_ids: Tensor, hidden: Tensor, position_ids: Tensor,
                cache: KVCache | TTTCache | None = None) -> tuple[Tensor, Tensor]:
        emb, hidden, cos, sin = self.step_inputs(input_ids, hidden, position_ids)
        x, residual = hidden, None
        for layer in self.layers:
            x, residual = layer(x, residual, emb, cos, sin, cache)
        next_hidden = x + residual
        return self.lm_head(self.norm(next_hidden)), next_hidden

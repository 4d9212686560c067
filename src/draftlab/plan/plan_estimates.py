"""The arithmetic behind `python -m draftlab plan`: the draft's shape and parameters, feature storage and training
memory, from the target's config.json and draftlab's config alone (no torch, no weights).

Training memory per GPU (`train_memory`), in bytes, with P all draft parameters, P_t the trained ones (the embedding
is the target's, frozen, when the widths agree; the head too under train.freeze_lm_head) and T the tokens one GPU
holds (train.batch_tokens / N, at least one train.max_seq_len row): fp32 weights, grads and AdamW's two moments, 4P +
12P_t (train/optim.py; fsdp divides them by N and adds the fp32 weights it gathers, root and one layer; ddp adds its
gradient buckets, 4P_t); bf16 copies of the Linear weights under autocast; the target's lm_head in the matmul dtype;
the batch in the pool's dtype and widened to fp32; and T x `activation_bytes`, what the padded TTT unroll keeps for
the backward, counted tensor by tensor (RMSNorm's fp32 rows, autocast's casts, the TTT cache, at step j the j
diagonal values and the fp32 keys of the scores, the MLP, the loss's fp32 logits, and its gradient at the backward's
start). Against torch.cuda.max_memory_allocated of real steps on an H100 (benchmarks/plan_memory.py; nine shapes in
benchmarks/results/h100_plan_memory.jsonl) it read 1-4% high. The packed unroll (one GPU) keeps less; CUDA's context and
the allocator's slack (1-2 GB) come on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftlab.data.room import BYTES_PER_SAMPLE, ITEMSIZE, bytes_per_token

GB = 1e9
TB = 1e12


def draft_shape(text: dict, draft_cfg, layer_ids: list[int], draft_vocab: int, max_seq_len: int) -> dict:
    """The draft's DraftModelConfig fields from the target's text config and draft.* (None = the target's value):
    what the plan counts, the train stage builds (`draft_config`) and benchmarks/peers/convert.py gives the peers.
    SGLang refuses a draft whose context is shorter than the target's (sglang-eagle3.md 1.7)."""
    hidden_t, heads_t = text["hidden_size"], text["num_attention_heads"]
    hidden = draft_cfg.hidden_size or hidden_t
    heads = draft_cfg.num_heads or heads_t
    same_attn = hidden == hidden_t and heads == heads_t
    rope = text.get("rope_parameters") or {}
    return {
        "hidden_size": hidden,
        "intermediate_size": draft_cfg.intermediate_size or text["intermediate_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": draft_cfg.num_kv_heads or text.get("num_key_value_heads") or heads,
        "head_dim": (text.get("head_dim") or hidden_t // heads_t) if same_attn else hidden // heads,
        "target_hidden_size": hidden_t,
        "aux_layer_ids": list(layer_ids),
        "vocab_size": text["vocab_size"],
        "draft_vocab_size": draft_vocab,
        "num_hidden_layers": draft_cfg.num_layers,
        "rms_norm_eps": text.get("rms_norm_eps", 1e-5),
        "rope_theta": text.get("rope_theta") or rope.get("rope_theta", 10000.0),
        "max_position_embeddings": max(text.get("max_position_embeddings", 2048), max_seq_len),
        "hidden_act": text.get("hidden_act", "silu"),
    }


@dataclass
class Params:
    total: int
    trained: int
    embedding: int  # frozen when `embedding_frozen`
    embedding_frozen: bool
    linear: int  # weights of Linear layers (fc, attention, MLP, head): what autocast copies to bf16
    root: int  # outside the decoder layers (embedding, fc, final norm, head): FSDP's root unit
    largest_layer: int
    head_frozen: bool = False  # train.freeze_lm_head


def draft_params(s: dict, freeze_head: bool = False) -> Params:
    """The parameter count of model/draft.py `Eagle3Draft(DraftModelConfig(**s))`, by its module layout;
    freeze_head: train.freeze_lm_head (the head not trained)."""
    H, Ht, I = s["hidden_size"], s["target_hidden_size"], s["intermediate_size"]
    q_out, kv_out = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    embedding = s["vocab_size"] * H
    fc = len(s["aux_layer_ids"]) * Ht * H
    head = H * s["draft_vocab_size"]
    layers, layer_linear = [], 0
    for i in range(s["num_hidden_layers"]):
        width_in = 2 * H if i == 0 else H  # layer 0 attends over [embedding; hidden]
        linear = width_in * (q_out + 2 * kv_out) + q_out * H + 3 * H * I
        layers.append(linear + (3 if i == 0 else 2) * H)  # input_layernorm (layer 0), hidden_norm, post_attention
        layer_linear += linear
    root = embedding + fc + H + head  # + the final norm
    frozen = H == Ht  # init_from_target copies and freezes the target's embedding when the widths agree
    total = root + sum(layers)
    trained = total - (embedding if frozen else 0) - (head if freeze_head else 0)
    return Params(total=total, trained=trained, embedding=embedding,
                  embedding_frozen=frozen, linear=fc + layer_linear + head, root=root,
                  largest_layer=max(layers, default=0), head_frozen=freeze_head)


def strategy_for(strategy: str, gpus: int) -> str:
    """What the trainer runs (train/distributed.py make_trainer): one process, ddp or fsdp."""
    if gpus <= 1:
        return "single"
    return "ddp" if strategy in ("auto", "ddp") else strategy


@dataclass
class Memory:
    strategy: str
    gpus: int
    tokens: int  # tokens one GPU holds in a batch
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def activation_bytes(s: dict, steps: int, amp: bool) -> float:
    """Bytes the TTT unroll keeps for the backward, per token (the padded unroll: every position computed)."""
    a, up = (2, 4) if amp else (4, 0)  # up: autocast's fp32 copies (a no-op in fp32)
    H, I, Vd = s["hidden_size"], s["intermediate_size"], s["draft_vocab_size"]
    heads, kv, hd = s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"]
    Hq = heads * hd
    # fc's input, the teacher's soft targets, and the loss's gradient at the backward's start (3 fp32 rows, 1 bf16)
    total = len(s["aux_layer_ids"]) * s["target_hidden_size"] * (a if amp else 0) + 4 * Vd + 14 * Vd
    for j in range(steps):
        for i in range(s["num_hidden_layers"]):
            # RMSNorm keeps its fp32 input and normed rows (8H; 4H on the frozen embedding's); layer 0's fp32
            # [embedding; hidden] is cast to bf16 once for each of q/k/v
            total += (20 * H + 3 * a * 2 * H) if i == 0 else (16 * H + a * H)
            total += a * Hq + 2 * a * kv * hd  # rotated queries; keys and values, kept by the TTT cache
            if j == 0:  # causal SDPA over keys repeated to every head (GQA), its output and o_proj's copy
                total += 2 * a * Hq * (heads != kv) + 2 * a * Hq
            else:  # ttt_attention: the j diagonal values over every head, the keys and query in fp32 (the
                width = hd + 8 * -(-2 * j // 8)  # scores), q/k/v/output widened by the null-key channels
                total += a * j * Hq + 4 * j * Hq + up * Hq + 4 * a * heads * width + a * Hq
            total += a * H + 4 * a * I  # the MLP's input, gate, up, activation and product
        total += 8 * H + a * H + 4 * Vd  # final norm, the head's input, the logits upcast by the loss
    return total


def train_memory(s: dict, p: Params, *, batch_tokens: int, max_seq_len: int, ttt_steps: int, strategy: str,
                 gpus: int, amp: bool, pool_dtype: str) -> Memory:
    """Peak training memory per GPU in bytes, by part (the formula is the module docstring's)."""
    mode = strategy_for(strategy, gpus)
    shard = gpus if mode == "fsdp" else 1
    Ht, n_aux = s["target_hidden_size"], len(s["aux_layer_ids"])
    T = int(max(-(-batch_tokens // gpus), min(batch_tokens, max_seq_len)))
    states = (4 * p.total + 4 * p.trained + 8 * p.trained) / shard
    if mode == "ddp":
        states += 4 * p.trained
    if mode == "fsdp":
        states += 4 * (p.root + p.largest_layer)
    parts = {
        "weights, grads, AdamW (fp32)": states,
        "bf16 weight copies (autocast)": 2 * p.linear if amp else 0.0,
        "target lm_head": s["vocab_size"] * Ht * (2 if amp else 4),
        "batch (features, last hidden)": T * (n_aux * Ht + Ht) * (ITEMSIZE[pool_dtype] + 4),
        "activations": T * activation_bytes(s, ttt_steps, amp),
    }
    return Memory(mode, gpus, T, parts)


@dataclass
class Storage:
    dtype: str
    feature_width: int
    hidden: int
    samples: int
    tokens_per_sample: float

    @property
    def tokens(self) -> float:
        return self.samples * self.tokens_per_sample

    @property
    def bytes_per_token(self) -> int:
        return bytes_per_token(self.dtype, self.feature_width, self.hidden)

    @property
    def feature_bytes(self) -> float:
        """The features alone: feature width x dtype per token."""
        return self.tokens * self.feature_width * ITEMSIZE[self.dtype]

    @property
    def pool_bytes(self) -> float:
        """The pool as extract writes it: features, last hidden state, ids and per-sample offsets."""
        return self.tokens * self.bytes_per_token + self.samples * BYTES_PER_SAMPLE


def human(n: float) -> str:
    """Bytes in the unit that reads best: 0.91 TB, 41.3 GB, 512 MB."""
    for unit, size in (("TB", TB), ("GB", GB), ("MB", 1e6), ("kB", 1e3)):
        if n >= size / 10 if unit == "TB" else n >= size:  # 0.91 TB reads better than 905.8 GB
            return f"{n / size:.{2 if unit == 'TB' else 1}f} {unit}"
    return f"{n:.0f} B"

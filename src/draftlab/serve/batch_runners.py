"""The target and the EAGLE-3 draft over a batch of requests, each row at its own KV length (serve/batch_cache.py).

The single-request runners (static_target.py, static_drafter.py) keep one host length; these keep one per row and
derive every step's slots, rope positions and mask from it, so a row computes what it would compute alone. Prompts
of different lengths prefill together, right-padded: a row's padding lands in slots past its length, masked until
its own tokens overwrite them. A finished row is frozen (its length stops), so the batch keeps one shape while
the others go on; its outputs are ignored. Steps run eagerly (no CUDA graphs: the per-row span is host state).
"""

from __future__ import annotations

import inspect

import torch

from draftlab.model.draft import Eagle3Draft
from draftlab.serve.batch_cache import RowKVCache, row_mask, row_slot_cache_class, row_slots
from draftlab.serve.static_target import _attention, cache_length, static_cache_obstacle


def _padded(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, longest] right-padded with 0, lengths [B])."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    ids = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return ids.to(device), lengths.to(device)


class BatchTargetRunner:
    """The target with a per-row slot cache; engine.TargetRunner's role for a batch."""

    def __init__(self, model, feature_layers=()):
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.feature_layers = tuple(feature_layers)
        why = static_cache_obstacle(model.config)
        if why:
            raise ValueError(f"the batched engine needs the static KV cache, and {why}")
        self._additive = None if _attention(model.config) == "sdpa" else self.dtype
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._position_kw = "cache_position" in params
        self.cache = None
        self.rows = 0
        self.lengths: list[int] = []

    def reserve(self, rows: int, tokens: int) -> None:
        """Room for `rows` requests of up to `tokens` positions each (new buffers only when it does not fit)."""
        if self.cache is None or rows != self.rows or tokens > self.cache.max_len:
            self.cache = row_slot_cache_class()(self.model.config, cache_length(tokens))
            self.rows = rows

    def _run(self, ids: torch.Tensor, slots: torch.Tensor, want_features: bool, span: int):
        if span > self.cache.max_len:
            raise RuntimeError(f"batched KV cache full: {span} > {self.cache.max_len} positions (reserve() first)")
        self.cache.slots, self.cache.span = slots, span
        kwargs = {self._cache_kw: self.cache}
        if self._position_kw:  # one row's positions; our cache and mask make no use of it
            kwargs["cache_position"] = slots[0]
        out = self.model(input_ids=ids, position_ids=slots, use_cache=True,
                         attention_mask=row_mask(slots, span, self._additive),
                         output_hidden_states=want_features, **kwargs)
        features = None
        if want_features and self.feature_layers:
            # hidden_states[0] is the embedding output, so layer k's output is hidden_states[k + 1]
            features = torch.cat([out.hidden_states[k + 1] for k in self.feature_layers], dim=-1)
        return out.logits, features

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], want_features: bool):
        """-> (logits [B, V] float32 at each row's last prompt token, features [B, longest, W] or None)."""
        ids, lengths = _padded(prompts, self.device)
        slots = torch.arange(ids.shape[1], device=self.device).expand_as(ids)
        logits, features = self._run(ids, slots, want_features, ids.shape[1])
        rows = torch.arange(len(prompts), device=self.device)
        self.lengths = lengths.tolist()
        return logits[rows, lengths - 1].float(), features

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, want_features: bool):
        """ids [B, T] at each row's positions length.. -> (logits [B, T, V] float32, features [B, T, W] or None).
        The lengths move only by `advance`: the engine knows how much of the block each row keeps."""
        base = torch.tensor(self.lengths, dtype=torch.long, device=self.device)
        logits, features = self._run(ids, row_slots(base, ids.shape[1]), want_features,
                                     max(self.lengths) + ids.shape[1])
        return logits.float(), features

    def advance(self, counts: list[int]) -> None:
        self.lengths = [n + c for n, c in zip(self.lengths, counts)]


class BatchEagle3Drafter:
    """static_drafter.StaticEagle3Drafter's chain semantics (SGLang's, topk 1) for every row of a batch."""

    def __init__(self, model: Eagle3Draft, feature_layers: tuple[int, ...]):
        self.model = model.eval()
        self.feature_layers = tuple(feature_layers)
        self.device = next(model.parameters()).device
        vocab = torch.arange(model.cfg.draft_vocab_size, device=self.device)
        self.target_ids = model.draft_to_target(vocab)  # draft id -> target id
        self.vocab_size = model.cfg.vocab_size
        self.cache: RowKVCache | None = None
        self.rows = 0
        self.lengths: list[int] = []
        self.logits = self.hidden = None  # each row's draft output at its last extended position

    def reserve(self, rows: int, tokens: int) -> None:
        if self.cache is None or rows != self.rows or tokens > self.cache.max_len:
            self.cache = RowKVCache(self.model.cfg.num_hidden_layers, cache_length(tokens))
            self.rows = rows

    def _forward(self, ids, hidden, slots, span):
        self.cache.slots, self.cache.span = slots, span
        return self.model(ids, hidden, slots, self.cache)

    def _keep(self, logits, hidden, rows: torch.Tensor) -> None:
        """The state the next propose starts from: each row's output at its index in `rows` [B]."""
        every = torch.arange(logits.shape[0], device=self.device)
        self.logits, self.hidden = logits[every, rows], hidden[every, rows][:, None]

    @torch.inference_mode()
    def start(self, prompts: list[list[int]], first: torch.Tensor, features: torch.Tensor) -> None:
        """Position t pairs feature f_t with token t+1: each prompt shifted by one, then its first token."""
        ids, lengths = _padded([p[1:] + [0] for p in prompts], self.device)
        every = torch.arange(len(prompts), device=self.device)
        ids[every, lengths - 1] = first.to(self.device)
        slots = torch.arange(ids.shape[1], device=self.device).expand_as(ids)
        logits, hidden = self._forward(ids, features[:, : ids.shape[1]], slots, ids.shape[1])
        self._keep(logits, hidden, lengths - 1)
        self.lengths = lengths.tolist()

    def _pick(self, logits, temperature: float, generator):
        """Each row's draft token [B] (target ids) and, when sampling, its q [B, V] over the target vocabulary."""
        if temperature <= 0:
            return self.target_ids[logits.argmax(-1)], None
        q_draft = torch.softmax(logits.float() / temperature, -1)
        draft_id = torch.multinomial(q_draft, 1, generator=generator)[:, 0]
        q = torch.zeros(q_draft.shape[0], self.vocab_size, device=self.device)
        q.scatter_add_(1, self.target_ids.expand_as(q_draft), q_draft)
        return self.target_ids[draft_id], q

    @torch.inference_mode()
    def propose(self, k: int, temperature: float, generator):
        """-> (drafts [B, k], q [B, k, V] or None); step j writes slot length + j of each row."""
        base = torch.tensor(self.lengths, dtype=torch.long, device=self.device)
        logits, hidden, tokens, qs = self.logits, self.hidden, [], []
        for j in range(k):
            token, q = self._pick(logits, temperature, generator)
            tokens.append(token)
            if q is not None:
                qs.append(q)
            if j < k - 1:
                out, hidden = self._forward(token[:, None], hidden, row_slots(base + j, 1), max(self.lengths) + j + 1)
                logits = out[:, -1]
        return torch.stack(tokens, 1), (torch.stack(qs, 1) if qs else None)

    @torch.inference_mode()
    def commit(self, tokens: torch.Tensor, features: torch.Tensor, counts: list[int]) -> None:
        """Extends every row over its block tokens [B, k+1] with features [B, k+1, W]; row b keeps counts[b] of
        them (0: a finished row, frozen). The rest is padding past the row's length, masked until overwritten."""
        base = torch.tensor(self.lengths, dtype=torch.long, device=self.device)
        logits, hidden = self._forward(tokens, features, row_slots(base, tokens.shape[1]),
                                       max(self.lengths) + tokens.shape[1])
        keep = torch.tensor([max(c, 1) - 1 for c in counts], dtype=torch.long, device=self.device)
        self._keep(logits, hidden, keep)
        self.lengths = [n + c for n, c in zip(self.lengths, counts)]

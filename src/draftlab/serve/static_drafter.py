"""The EAGLE-3 drafter of serve/eagle3_drafter.py on a static KV cache (serve/draft_cache.py), with fixed-shape
steps that can run as CUDA graphs (serve/cuda_graphs.py). Same semantics, same `Drafter` protocol.

Two steps have fixed shapes once num_steps = k is known:
- extend (`commit`): always k+1 rows. The m+1 committed tokens and their target features fill the first rows;
  the rest is padding whose KV entries land in slots past the committed length, where they stay masked until
  the next step overwrites them (draft step j writes slot length+j before its query reads it). The state the
  next propose starts from is taken at row m, chosen by a device index, so no shape depends on m.
- propose, greedy: the whole chain of k-1 draft forwards and k argmaxes is one step (one graph replay).
Sampling (temperature > 0) runs the same chain eagerly: it draws from a torch.Generator, kept out of graphs.
The prompt's extend (`start`) has the prompt's length, so it runs eagerly, on the same cache.
"""

from __future__ import annotations

import logging

import torch

from draftlab.model.draft import Eagle3Draft
from draftlab.serve.cuda_graphs import StepGraph
from draftlab.serve.draft_cache import StaticKVCache
from draftlab.serve.eagle3_drafter import draft_chain
from draftlab.serve.static_target import cache_length

log = logging.getLogger("draftlab.serve")


class StaticEagle3Drafter:
    def __init__(self, model: Eagle3Draft, feature_layers: tuple[int, ...], graphs: bool = False, max_len: int = 0):
        self.model = model.eval()
        self.feature_layers = tuple(feature_layers)
        self.graphs = graphs
        self.full_spans = graphs  # attend over every slot: graphs, and steps whose position only the device knows
        cfg = model.cfg
        self.device = next(model.parameters()).device
        dtype = model.lm_head.weight.dtype
        vocab = torch.arange(cfg.draft_vocab_size, device=self.device)
        self.target_ids = model.draft_to_target(vocab)  # draft id -> target id (identity without d2t)
        self.vocab_size = cfg.vocab_size
        self.feature_width = cfg.num_aux * cfg.target_hidden_size
        self.cache: StaticKVCache | None = None
        self.length = 0  # extended positions 0..length-1 hold real (target-feature) KV entries
        # the draft's output at the last extended position: what the next propose starts from (static buffers)
        self.logits = torch.zeros(cfg.draft_vocab_size, dtype=dtype, device=self.device)
        self.hidden = torch.zeros(1, 1, cfg.hidden_size, dtype=dtype, device=self.device)
        self._base = torch.zeros((), dtype=torch.long, device=self.device)
        self._block = None  # rows of an extend step: k + 1, known at the first propose
        self._extend: dict[int, tuple[StepGraph, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._propose: dict[int, StepGraph] = {}
        self.reserve(max_len)

    def reserve(self, tokens: int) -> None:
        """Room for `tokens` positions; a larger cache means new buffers, so captured steps are dropped."""
        if self.cache is not None and tokens <= self.cache.max_len:
            return
        self.cache = StaticKVCache(self.model.cfg.num_hidden_layers, cache_length(tokens))
        self._extend, self._propose = {}, {}

    # --- the model calls (shared by the eager and the graphed paths) ---------------------------------------

    def _span(self, used: int) -> int | None:
        """Slots an eager step attends over: the used ones (cheaper, same result); a graph needs them all."""
        return None if self.full_spans else used

    def _forward(self, ids: torch.Tensor, hidden: torch.Tensor, slots: torch.Tensor, span: int | None):
        self.cache.slots, self.cache.span = slots, span
        return self.model(ids[None], hidden, slots[None], self.cache)

    def _extend_rows(self, ids: torch.Tensor, features: torch.Tensor, slots: torch.Tensor, last: torch.Tensor,
                     span: int | None):
        """Extends over rows ids/features at `slots`; the state becomes the draft's output at row `last` ([1])."""
        logits, hidden = self._forward(ids, features[None], slots, span)
        self.logits.copy_(logits[0].index_select(0, last)[0])
        self.hidden.copy_(hidden.index_select(1, last))
        return self.logits, self.hidden

    def _chain(self, k: int, temperature: float, generator):
        """k draft tokens from the current state; step j runs at position length + j on the draft's own hidden."""
        def step(j: int, token: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out, hidden = self._forward(token, hidden, (self._base + j).view(1), self._span(self.length + j + 1))
            return out[0, -1], hidden

        return draft_chain(k, self.logits, self.hidden, step, temperature, generator, self.target_ids,
                           self.vocab_size)

    # --- the Drafter protocol ------------------------------------------------------------------------------

    @torch.inference_mode()
    def start(self, prompt_ids: torch.Tensor, first_token: int, features: torch.Tensor) -> None:
        n = prompt_ids.numel()
        first = torch.tensor([first_token], dtype=torch.long, device=self.device)
        # position t pairs feature f_t with token t+1: the prompt shifted by one, then the first token
        ids = torch.cat([prompt_ids.to(self.device)[1:], first])
        slots = torch.arange(n, device=self.device)
        self._extend_rows(ids, features.to(self.device), slots, slots[-1:], n)
        self.length = n

    @torch.inference_mode()
    def commit(self, tokens: torch.Tensor, features: torch.Tensor) -> None:
        n = tokens.numel()
        if features.shape[0] != n:
            raise ValueError(f"extend: {n} tokens but {features.shape[0]} feature rows")
        block = self._block or n
        if n > block:
            raise ValueError(f"extend: {n} committed tokens, more than num_steps + 1 = {block}")
        step, ids, feats, count = self._extend_step(block)
        ids[:n].copy_(tokens)
        feats[:n].copy_(features)
        count.fill_(n)
        self._base.fill_(self.length)
        step()
        self.length += n

    def _extend_step(self, block: int):
        if block not in self._extend:
            ids = torch.zeros(block, dtype=torch.long, device=self.device)
            feats = torch.zeros(block, self.feature_width, dtype=self.hidden.dtype, device=self.device)
            count = torch.ones((), dtype=torch.long, device=self.device)
            rows = torch.arange(block, device=self.device)

            def fn():
                return self._extend_rows(ids, feats, self._base + rows, (count - 1).view(1),
                                         self._span(self.length + block))

            step = StepGraph(fn, f"draft extend of {block} rows", self.graphs, self.device)
            self._extend[block] = (step, ids, feats, count)
        return self._extend[block]

    @torch.inference_mode()
    def propose(self, k: int, temperature: float, generator: torch.Generator | None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self._block = k + 1
        self._base.fill_(self.length)
        if temperature > 0:
            return self._chain(k, temperature, generator)
        if k not in self._propose:
            self._propose[k] = StepGraph(lambda: self._chain(k, 0.0, None)[:1], f"draft chain of {k} steps",
                                         self.graphs, self.device)
        return self._propose[k]()[0], None

    def graph_report(self) -> dict[str, str]:
        steps = [s for s, *_ in self._extend.values()] + list(self._propose.values())
        return {s.name: s.state for s in steps}

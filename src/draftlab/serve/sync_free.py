"""Greedy decoding with no host synchronisation inside a cycle: speculative (chain, batch 1) and plain.

The per-cycle engine (serve/engine.py) learns m, the accepted length, on the host after every verification and
only then launches the next steps, so the GPU idles while Python does the bookkeeping. Here one whole cycle is one
fixed-shape step, captured as one CUDA graph: verify [last, d_1..d_k] on the target, accept on the device, record
(m, committed tokens) in a ring, advance the target's and the draft's positions by m + 1 on the device, extend the
draft over the k + 1 verified rows (the first m + 1 are real, the rest masked padding, as in
serve/static_drafter.py) and draft the next k tokens. The host replays up to `SYNC_EVERY` cycles back to back,
then reads the ring once and applies the stop rules of `engine.take`: the output is token for token the per-cycle
engine's (and the target's own greedy decode in fp32). Plain decoding gets the same treatment, one token a step,
so the speed-up compares like with like.

A chunk holds at most ceil(remaining / (k + 1)) cycles, so it commits at most remaining + k tokens; the caches are
reserved k + 1 positions longer for those and for the draft chain after the last cycle. After an EOS the rest of
its chunk is computed and thrown away (at most SYNC_EVERY - 1 cycles a request, timed but not counted as verify
steps).
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from draftlab.serve.cuda_graphs import StepGraph
from draftlab.serve.engine import Generation, _sync, new_request, take, verify_greedy

SYNC_EVERY = 8  # cycles between host reads; the EOS overshoot costs up to SYNC_EVERY - 1 cycles a request


class _ChunkedDecoder:
    """What both decoders share: one captured step (`step`) on `device`."""

    device: torch.device
    step: StepGraph | None

    def graph_report(self) -> dict[str, str]:
        return {self.step.name: self.step.state} if self.step is not None else {}

    def _done(self, gen: Generation, started: float) -> Generation:
        _sync(self.device)
        gen.seconds = time.perf_counter() - started
        return gen


class SyncFreeSpec(_ChunkedDecoder):
    """Greedy chain speculation over a StaticTargetRunner and a StaticEagle3Drafter (engine.SpecEngine's results)."""

    def __init__(self, engine):
        """engine: a SpecEngine whose target runner and drafter have static caches (serve/modes.py GRAPHS/STATIC)."""
        self.engine, self.target, self.drafter = engine, engine.target, engine.drafter
        if not (hasattr(self.target, "_run") and hasattr(self.drafter, "_extend_rows")):
            raise TypeError("the sync-free engine needs static caches: serve/static_target.py's runner and "
                            f"serve/static_drafter.py's drafter, not {type(self.target).__name__} and "
                            f"{type(self.drafter).__name__}")
        self.k = k = engine.num_steps
        self.eos = engine.eos
        self.device = device = self.target.device
        # positions live on the device, so every step attends over all slots; for good (the results are the same,
        # only the drafter's eager steps get slower)
        self.drafter.full_spans = True
        self.last = torch.zeros(1, dtype=torch.long, device=device)
        self.drafts = torch.zeros(k, dtype=torch.long, device=device)
        self.target_len = torch.zeros((), dtype=torch.long, device=device)
        self.draft_len = torch.zeros((), dtype=torch.long, device=device)
        self.index = torch.zeros((), dtype=torch.long, device=device)
        self.ring = torch.zeros(SYNC_EVERY, k + 2, dtype=torch.long, device=device)  # per cycle: m, tokens [k+1]
        self.rows = torch.arange(k + 1, device=device)
        self.step: StepGraph | None = None
        self._caches: tuple = (None, None)
        self.feature_dtype = self.drafter.hidden.dtype

    def reserve(self, prompt_len: int, max_new_tokens: int) -> int:
        """engine.SpecEngine.reserve, k + 1 positions longer for a chunk's overshoot."""
        return self.engine.reserve(prompt_len, max_new_tokens + self.k + 1)

    def _cycle(self) -> tuple[torch.Tensor, ...]:
        target, drafter, k = self.target, self.drafter, self.k
        logits, features = target._run(torch.cat([self.last, self.drafts]), self.target_len + self.rows, True, False)
        m, tokens = verify_greedy(self.drafts, logits)
        self.ring.index_copy_(0, self.index.view(1), torch.cat([m.view(1), tokens])[None])
        self.index += 1
        self.target_len += m + 1
        self.last.copy_(tokens.index_select(0, m.view(1)))
        drafter._extend_rows(tokens, features.to(self.feature_dtype), self.draft_len + self.rows, m.view(1), None)
        self.draft_len += m + 1
        drafter._base.copy_(self.draft_len)
        drafts, _ = drafter._chain(k, 0.0, None)
        self.drafts.copy_(drafts)
        return m.view(1), tokens

    def _cycle_step(self) -> StepGraph:
        caches = (self.target.cache, self.drafter.cache)  # a grown cache has new buffers: capture again
        if self.step is None or any(a is not b for a, b in zip(self._caches, caches)):
            self._caches = caches
            state = (self.last, self.drafts, self.target_len, self.draft_len, self.index, self.ring)
            self.step = StepGraph(self._cycle, f"speculative cycle of {self.k} draft steps", self.target.graphs,
                                  self.target.device, state=state)
        return self.step

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> Generation:
        if temperature > 0:
            raise ValueError("the sync-free engine is greedy only (temperature 0); sampling runs per cycle")
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        target, drafter, k = self.target, self.drafter, self.k
        ids, gen, started = new_request(prompt_ids, target.device)
        self.reserve(gen.prompt_len, max_new_tokens)
        target.reset()
        logits, features = target.forward(ids, True, last_only=True)
        first = int(logits[-1].argmax(-1))
        if take(self.eos, [first], gen, max_new_tokens):
            return self._done(gen, started)
        drafter.start(ids, first, features)
        self.drafts.copy_(drafter.propose(k, 0.0, None)[0])
        self.last.fill_(first)
        self.target_len.fill_(target.length)
        self.draft_len.fill_(drafter.length)
        step = self._cycle_step()
        while True:
            remaining = max_new_tokens - len(gen.tokens)
            cycles = max(1, min(SYNC_EVERY, -(-remaining // (k + 1))))
            self.index.zero_()
            for _ in range(cycles):
                step()
            for row in self.ring[:cycles].tolist():  # the one host sync of the chunk
                m = row[0]
                gen.verify_steps += 1
                gen.accepted.append(m)
                if take(self.eos, row[1:m + 2], gen, max_new_tokens):
                    return self._done(gen, started)


class SyncFreePlain(_ChunkedDecoder):
    """Plain greedy decoding over a StaticTargetRunner, SYNC_EVERY one-token steps between host reads."""

    def __init__(self, runner):
        self.runner = runner
        self.device = device = runner.device
        self.last = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.index = torch.zeros((), dtype=torch.long, device=device)
        self.ring = torch.zeros(SYNC_EVERY, dtype=torch.long, device=device)
        self.step: StepGraph | None = None
        self._cache = None

    def _decode(self) -> tuple[torch.Tensor, ...]:
        (logits,) = self.runner._run(self.last, self.position, False, False)
        token = logits[-1].argmax(-1, keepdim=True)
        self.ring.index_copy_(0, self.index.view(1), token)
        self.index += 1
        self.position += 1
        self.last.copy_(token)
        return (token,)

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int,
                 eos_token_ids: Sequence[int]) -> Generation:
        runner = self.runner
        eos = set(int(e) for e in eos_token_ids)
        ids, gen, started = new_request(prompt_ids, runner.device)
        runner.reserve(gen.prompt_len + max_new_tokens)
        runner.reset()
        logits, _ = runner.forward(ids, False, last_only=True)
        first = int(logits[-1].argmax(-1))
        if take(eos, [first], gen, max_new_tokens):
            return self._done(gen, started)
        self.last.fill_(first)
        self.position.fill_(runner.length)
        if self.step is None or self._cache is not runner.cache:  # a grown cache has new buffers: capture again
            self._cache = runner.cache
            self.step = StepGraph(self._decode, "plain decode step", runner.graphs, runner.device,
                                  state=(self.last, self.position, self.index, self.ring))
        while True:
            steps = min(SYNC_EVERY, max_new_tokens - len(gen.tokens))
            self.index.zero_()
            for _ in range(steps):
                self.step()
            for token in self.ring[:steps].tolist():
                gen.verify_steps += 1
                if take(eos, [token], gen, max_new_tokens):
                    return self._done(gen, started)

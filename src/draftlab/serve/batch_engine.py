"""Chain speculative decoding of a batch of requests, acceptance per row (serve/engine.py's rules, per row).

One cycle: the drafter proposes k tokens for every row, ONE target forward verifies every row's block
[last committed token, d_1..d_k] at that row's own positions, and each row accepts its own longest agreeing
prefix m_b plus the bonus. Rows keep their own KV lengths (serve/batch_runners.py), so they drift apart freely; a
row that hits EOS or its length limit is frozen and the batch goes on until every row is done. Greedy output is,
row by row, the target's own greedy decode (tests/unit/test_engine_batch.py checks fp32 at several batch sizes).

`batch_target_decode` is the baseline on the same runner: every row one token per forward.
The batched steps run eagerly (no CUDA graphs yet): batch size 1 is measured by engine.SpecEngine, which has them.
"""

from __future__ import annotations

import time

import torch

from draftlab.serve.batch_runners import BatchEagle3Drafter, BatchTargetRunner
from draftlab.serve.engine import Generation, _sync, take, verify_greedy, verify_sampling


def _sample_rows(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """One token per row [B] from logits [B, V] (greedy at temperature 0)."""
    if temperature <= 0:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]


class BatchSpecEngine:
    def __init__(self, model, drafter: BatchEagle3Drafter, num_steps: int, eos_token_ids, runner=None):
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self.target = runner or BatchTargetRunner(model, drafter.feature_layers)
        if self.target.feature_layers != tuple(drafter.feature_layers):
            raise ValueError(f"the target runner captures layers {self.target.feature_layers}, the drafter wants "
                             f"{tuple(drafter.feature_layers)}")
        self.drafter = drafter
        self.num_steps = num_steps
        self.eos = set(int(e) for e in eos_token_ids)

    def _verify(self, drafts, q, logits, temperature, generator, active):
        if temperature <= 0:
            return verify_greedy(drafts, logits)  # per row: drafts [B, k], logits [B, k+1, V]
        p = torch.softmax(logits / temperature, dim=-1)
        m, tokens = torch.zeros(len(active), dtype=torch.long, device=drafts.device), torch.zeros_like(logits[..., 0],
                                                                                                    dtype=torch.long)
        for b in (b for b, on in enumerate(active) if on):  # one generator stream, rows in order
            m[b], tokens[b] = verify_sampling(drafts[b], q[b], p[b], generator)
        return m, tokens

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> list[Generation]:
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        target, k, rows = self.target, self.num_steps, len(prompts)
        started = time.perf_counter()
        longest = max(len(p) for p in prompts) + max_new_tokens + k + 1
        target.reserve(rows, longest)
        self.drafter.reserve(rows, longest)
        logits, features = target.prefill(prompts, True)
        first = _sample_rows(logits, temperature, generator)
        gens = [Generation(prompt_len=len(p), tokens=[], verify_steps=0) for p in prompts]
        active = [not take(self.eos, [t], g, max_new_tokens) for t, g in zip(first.tolist(), gens)]
        self.drafter.start(prompts, first, features)
        last = first
        while any(active):
            drafts, q = self.drafter.propose(k, temperature, generator)
            logits, features = target.forward(torch.cat([last[:, None], drafts], 1), True)
            m_t, tokens_t = self._verify(drafts, q, logits, temperature, generator, active)
            host = torch.cat([m_t[:, None], tokens_t], 1).tolist()  # the one host sync of the cycle
            counts = []
            for b, (gen, row) in enumerate(zip(gens, host)):
                if not active[b]:
                    counts.append(0)
                    continue
                m = row[0]
                gen.verify_steps += 1
                gen.accepted.append(m)
                active[b] = not take(self.eos, row[1: m + 2], gen, max_new_tokens)
                counts.append(m + 1 if active[b] else 0)  # a finished row is frozen where it stands
            if not any(active):
                break
            target.advance(counts)
            self.drafter.commit(tokens_t, features, counts)
            last = tokens_t.gather(1, m_t[:, None])[:, 0]
        return _finish(gens, target.device, started)


def _finish(gens: list[Generation], device, started: float) -> list[Generation]:
    """Every row shares the batch's wall time: tokens/s of a batch is its tokens over that time."""
    _sync(device)
    seconds = time.perf_counter() - started
    for gen in gens:
        gen.seconds = seconds
    return gens


@torch.inference_mode()
def batch_target_decode(runner: BatchTargetRunner, prompts: list[list[int]], max_new_tokens: int, eos_token_ids,
                        temperature: float = 0.0, generator: torch.Generator | None = None) -> list[Generation]:
    """The target alone on the batch, one token per row per forward, finished rows frozen."""
    eos = set(int(e) for e in eos_token_ids)
    started = time.perf_counter()
    runner.reserve(len(prompts), max(len(p) for p in prompts) + max_new_tokens + 1)
    logits, _ = runner.prefill(prompts, False)
    gens = [Generation(prompt_len=len(p), tokens=[], verify_steps=0) for p in prompts]
    active = [True] * len(prompts)
    while True:
        token = _sample_rows(logits, temperature, generator)
        for b, value in enumerate(token.tolist()):
            if active[b]:
                active[b] = not take(eos, [value], gens[b], max_new_tokens)
        if not any(active):
            break
        out, _ = runner.forward(token[:, None], False)
        runner.advance([1 if on else 0 for on in active])
        for gen, on in zip(gens, active):
            gen.verify_steps += on
        logits = out[:, -1]
    return _finish(gens, runner.device, started)

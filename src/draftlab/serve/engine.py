"""Local lossless speculative decoding: chain drafting at batch size 1 with SGLang's EAGLE-3 bookkeeping.

One cycle: the drafter proposes k = `num_steps` tokens (top-1 each), ONE target forward verifies
[last committed token, d_1..d_k], the longest agreeing prefix d_1..d_m is accepted plus the target's own next
token (the bonus), both KV caches roll back to the accepted length, and the drafter "extends" over the m+1
committed tokens with the target features computed in that same verify forward (positions n-1..n-1+m, the
inputs x_{n-1}, d_1..d_m: feature f_t pairs with token x_{t+1}, docs/ARCHITECTURE.md "Draft alignment").

Greedy (temperature 0) output is token for token the target's own greedy decode; with temperature > 0 the
standard speculative rejection rule (accept with min(1, p/q), else resample from norm(max(0, p - q)), bonus
from p) keeps the output distribution equal to the target's. The engine knows nothing about EAGLE-3: a
drafter only has to follow the `Drafter` protocol, so losslessness is tested with trivial drafters.

The CUDA path syncs with the host once per cycle (to learn m); the drafted tokens stay on the device.
serve/sync_free.py removes that sync for greedy decoding on static caches: whole cycles replayed, m kept on the device.
The target's KV cache is dynamic here (TargetRunner, grows by concatenation) or static (serve/static_target.py,
preallocated, fixed-shape steps that can run as CUDA graphs); `serve/modes.py` builds either.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch


class Drafter(Protocol):
    """What the engine needs from a draft model. Token ids are target-vocabulary ids."""

    # target layers (output of decoder layer k = HF hidden_states[k+1]) whose concatenated outputs the
    # drafter wants in start/commit, ascending; () = the drafter needs no features.
    feature_layers: tuple[int, ...]

    def start(self, prompt_ids: torch.Tensor, first_token: int, features: torch.Tensor | None) -> None:
        """A new request. prompt_ids [P] (device), the target's first token, features [P, W] for positions
        0..P-1 (feature t pairs with token t+1 of prompt + [first_token])."""

    def propose(self, k: int, temperature: float, generator: torch.Generator | None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """k draft tokens [k] long (device) continuing the committed sequence; with temperature > 0 also the
        draft distributions q [k, V] (target vocabulary) they were sampled from, else None."""

    def commit(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        """The tokens committed by one cycle (accepted drafts + bonus; [m+1] long, device) and the target
        features [m+1, W] of the positions just before each of them. Drafted KV entries must be dropped by
        now (in propose or here)."""


@dataclass
class Generation:
    prompt_len: int
    tokens: list[int]  # completion tokens (EOS included when generated), like generate()[prompt_len:]
    verify_steps: int  # target forwards after the prefill
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted per verify step (0..k)
    committed: list[int] = field(default_factory=list)  # tokens committed per step (bonus incl., truncated)
    seconds: float = 0.0
    stop: str = "length"  # eos | length

    @property
    def tau(self) -> float:
        """SGLang's per-request spec_accept_length: completion tokens / verify steps (the prefill token is in
        the numerator, as in SGLang)."""
        return len(self.tokens) / max(self.verify_steps, 1)


def new_request(prompt_ids, device: torch.device) -> tuple[torch.Tensor, Generation, float]:
    """(the prompt's ids on the device, an empty Generation for it, the request's start time)."""
    started = time.perf_counter()
    ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).flatten()
    return ids, Generation(prompt_len=int(ids.numel()), tokens=[], verify_steps=0), started


def _rollback_length(cache_len_before: int, accepted: int) -> int:
    """Target KV length to keep after a verify step: the old cache plus the verified inputs
    x_{n-1}, d_1..d_m (m+1 entries). The bonus token has no KV yet; it is the next cycle's first input.
    (A separate function so a test can break it and watch the losslessness test fail.)"""
    return cache_len_before + accepted + 1


def crop_cache(cache, keep: int) -> None:
    """Drops KV entries beyond `keep`. transformers 5.24's crop() only takes a negative count."""
    remove = cache.get_seq_length() - keep
    if remove > 0:
        cache.crop(-remove)
    elif remove < 0:
        raise RuntimeError(f"cannot grow a KV cache by cropping ({cache.get_seq_length()} -> {keep})")


class TargetRunner:
    """The target (a transformers causal LM) with its KV cache; one instance per model, reused per request."""

    def __init__(self, model, feature_layers: Sequence[int] = ()):
        self.model = model
        self.device = next(model.parameters()).device
        self.feature_layers = tuple(feature_layers)
        num_layers = model.config.num_hidden_layers
        if any(not 0 <= k < num_layers for k in self.feature_layers):
            raise ValueError(f"feature layers {self.feature_layers} outside the target's 0..{num_layers - 1}")
        # transformers 5.24 renamed past_key_values -> cache (the old name warns); older ones only know the old.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = "logits_to_keep" if "logits_to_keep" in params else None
        self.cache = None

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        for layer in self.cache.layers:  # sliding-window layers keep what a rejected draft may need to crop back to
            if hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording()

    def reserve(self, tokens: int) -> None:
        """A dynamic cache grows as it goes (serve/static_target.py preallocates instead)."""

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def forward(self, ids: torch.Tensor, want_features: bool, last_only: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids [T] appended to the cache -> (logits [T, V] float32 ([1, V] if last_only), features [T, W])."""
        kwargs = {self._cache_kw: self.cache}
        if last_only and self._keep_kw:  # a prefill needs one row of logits, not T x vocab
            kwargs[self._keep_kw] = 1
        out = self.model(input_ids=ids[None], use_cache=True, output_hidden_states=want_features, **kwargs)
        features = None
        if want_features and self.feature_layers:
            # hidden_states[0] is the embedding output, so layer k's output is hidden_states[k + 1]
            features = torch.cat([out.hidden_states[k + 1][0] for k in self.feature_layers], dim=-1)
        return out.logits[0].float(), features

    def crop(self, keep: int) -> None:
        crop_cache(self.cache, keep)


def _sample(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """One token from logits [V] (greedy at temperature 0), as a 0-d device tensor."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[0]


def verify_greedy(drafts: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """drafts [k], target logits [k+1, V] of the verify forward -> (m, committed tokens [k+1] of which the
    first m+1 count); with a batch dimension in front, per row. Greedy: the committed tokens are the target's own
    argmaxes g_0..g_m."""
    target = logits.argmax(-1)
    m = torch.cumprod((drafts == target[..., :-1]).long(), -1).sum(-1)
    return m, target


def verify_sampling(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative rejection sampling (Leviathan et al. 2023, Chen et al. 2023) for a chain.

    drafts [k] sampled from q [k, V]; target probabilities p [k+1, V]. Draft i is accepted with probability
    min(1, p_i(d_i) / q_i(d_i)); at the first rejection the token is resampled from norm(max(0, p_i - q_i));
    if all k are accepted the bonus comes from p_k. Returns (m, committed tokens [k+1], first m+1 count).
    """
    k = drafts.shape[0]
    idx = drafts[:, None]
    p_d = p[:k].gather(1, idx)[:, 0]
    q_d = q.gather(1, idx)[:, 0]
    u = torch.rand(k, generator=generator, device=p.device)
    m = torch.cumprod((u * q_d < p_d).long(), 0).sum()  # u < p/q without dividing by q
    # residual distribution at every position (only the one at m is used); row k (no draft) is plain p
    residual = p.clone()
    residual[:k] = (p[:k] - q).clamp_min(0)
    degenerate = residual.sum(-1, keepdim=True) <= 0  # p == q exactly: any rejection is impossible anyway
    residual = torch.where(degenerate, p, residual)
    row = residual.index_select(0, m.view(1))  # multinomial normalises; no host sync to pick the row
    bonus = torch.multinomial(row, 1, generator=generator)[0, 0]
    tokens = torch.cat([drafts, drafts.new_zeros(1)])
    tokens = tokens.scatter(0, m.view(1), bonus.view(1))
    return m, tokens


class SpecEngine:
    """Chain speculative decoding of one request at a time: target + drafter, both with KV caches."""

    def __init__(self, model, drafter: Drafter, num_steps: int, eos_token_ids: Sequence[int], runner=None):
        """runner: the target's runner (default: TargetRunner, a dynamic cache; serve/static_target.py's
        StaticTargetRunner for a static one); it must capture the drafter's feature layers."""
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self.target = runner or TargetRunner(model, getattr(drafter, "feature_layers", ()))
        if self.target.feature_layers != tuple(getattr(drafter, "feature_layers", ())):
            raise ValueError(f"the target runner captures layers {self.target.feature_layers}, the drafter wants "
                             f"{tuple(getattr(drafter, 'feature_layers', ()))}")
        self.drafter = drafter
        self.num_steps = num_steps
        self.eos = set(int(e) for e in eos_token_ids)

    def reserve(self, prompt_len: int, max_new_tokens: int) -> int:
        """Sizes the target's and the drafter's KV caches for a request of this prompt and answer length (a static
        cache preallocates, a dynamic one ignores it); returns the positions: the longest such a request can get,
        prompt, answer, and one verify block past its last token."""
        longest = prompt_len + max_new_tokens + self.num_steps + 1
        self.target.reserve(longest)
        if hasattr(self.drafter, "reserve"):
            self.drafter.reserve(longest)
        return longest

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> Generation:
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        target, k = self.target, self.num_steps
        want = bool(target.feature_layers)
        ids, gen, started = new_request(prompt_ids, target.device)
        self.reserve(gen.prompt_len, max_new_tokens)
        target.reset()
        logits, features = target.forward(ids, want, last_only=True)
        first = int(_sample(logits[-1], temperature, generator))
        if take(self.eos, [first], gen, max_new_tokens):
            return self._done(gen, started)
        self.drafter.start(ids, first, features)
        last = torch.tensor([first], dtype=torch.long, device=target.device)
        while True:
            drafts, q = self.drafter.propose(k, temperature, generator)
            before = target.length
            logits, features = target.forward(torch.cat([last, drafts]), want)
            if temperature <= 0:
                m_t, tokens_t = verify_greedy(drafts, logits)
            else:
                p = torch.softmax(logits / temperature, dim=-1)
                m_t, tokens_t = verify_sampling(drafts, q, p, generator)
            # the one host sync of the cycle: m and the committed tokens together
            host = torch.cat([m_t.view(1), tokens_t]).tolist()
            m, committed = host[0], host[1:host[0] + 2]
            gen.verify_steps += 1
            gen.accepted.append(m)
            if take(self.eos, committed, gen, max_new_tokens):
                return self._done(gen, started)
            target.crop(_rollback_length(before, m))
            self.drafter.commit(tokens_t[: m + 1], None if features is None else features[: m + 1])
            last = tokens_t[m: m + 1]

    def _done(self, gen: Generation, started: float) -> Generation:
        _sync(self.target.device)
        gen.seconds = time.perf_counter() - started
        return gen


def take(eos: set[int], committed: list[int], gen: Generation, max_new_tokens: int) -> bool:
    """Appends committed tokens, stopping exactly where greedy decode would (EOS kept, length limit);
    True when the request is finished."""
    stopped = False
    for taken, token in enumerate(committed, 1):
        gen.tokens.append(token)
        if token in eos or len(gen.tokens) >= max_new_tokens:
            gen.stop = "eos" if token in eos else "length"
            stopped = True
            break
    if gen.verify_steps:  # the prefill's token is not a verify step
        gen.committed.append(taken)
    return stopped


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def target_decode(model, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int,
                  eos_token_ids: Sequence[int], temperature: float = 0.0,
                  generator: torch.Generator | None = None, runner: TargetRunner | None = None) -> Generation:
    """The baseline: the target alone, one token per forward with a KV cache, through the same forward call
    as the engine, so speed-ups compare like with like. Greedy equals model.generate(do_sample=False)."""
    runner = runner or TargetRunner(model)
    eos = set(int(e) for e in eos_token_ids)
    ids, gen, started = new_request(prompt_ids, runner.device)
    runner.reserve(gen.prompt_len + max_new_tokens)
    runner.reset()
    logits, _ = runner.forward(ids, False, last_only=True)
    while True:
        token = _sample(logits[-1], temperature, generator)
        value = int(token)  # the host needs it anyway to test for EOS, as generate() does
        gen.tokens.append(value)
        if value in eos or len(gen.tokens) >= max_new_tokens:
            gen.stop = "eos" if value in eos else "length"
            break
        logits, _ = runner.forward(token.view(1), False)
        gen.verify_steps += 1
    _sync(runner.device)
    gen.seconds = time.perf_counter() - started
    return gen

"""`data.generator=graphs`: greedy answers from a batch of slots that stays full, with the decode step replayed as
one CUDA graph (draftlab/generation/decode_slots.py has the step and the cache).

The schedule: prompts are queued longest first (a prefill pads to its longest prompt, so neighbours of similar
length waste little), the slots are filled, and the graph is replayed a few steps at a time. After each burst the
host reads the slots' done flags (the only read-back); finished answers are collected and their slots refilled
with the next prompts. A prefill is an eager forward whose cost hardly depends on its row count, so slots are
refilled once a quarter of them are free (`refill`), or all the queue fits, not one at a time. A burst never runs
past the step at which the next slot reaches `max_new_tokens`, and is at most `check_every` steps long, so a slot
ending at an end-of-turn token idles at most `check_every - 1` steps.

Same answers as the plain path (generation/plain.py `generate_batch`): greedy decoding of a prompt does not depend
on its neighbours, its padding or where its keys sit in the cache in exact arithmetic; in fp32 the answers are
equal token for token (tests/unit/test_fastgen.py). In bf16 they are not bit-equal (other reduction orders:
BENCHMARKS.md "Generation throughput"), which is why `data.generator` is part of the generate stage's key.
Greedy only: sampling stays on the plain path, whose per-batch seeding makes a resumed pool equal an
uninterrupted one.
"""

from __future__ import annotations

import gc
import logging
import math
from collections import deque

import torch

from draftlab.generation.decode_slots import DecodeSlots, cache_columns, slot_attention

log = logging.getLogger("draftlab.generate")

REFILL = 0.25     # refill once this share of the slots is free (or the whole queue fits)
CHECK_EVERY = 8   # most decode steps between two reads of the done flags

# generation_config settings that HF generate applies to greedy decoding too (logits processors): graphs takes the
# plain argmax, so a target that sets one is refused rather than answered differently
GREEDY_PROCESSORS = ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "suppress_tokens",
                     "begin_suppress_tokens", "min_length", "min_new_tokens", "forced_bos_token_id",
                     "forced_eos_token_id", "sequence_bias", "exponential_decay_length_penalty")

_slots: DecodeSlots | None = None  # one captured set at a time, reused across shards (same shapes: no new capture)
_compiles: list[tuple[float, bool]] = []  # each compiled step built since release(): (seconds, from the cache)


@torch.inference_mode()
def generate_graphs(target, prompts: list[list[int]], max_new_tokens: int, slots: int, width: int,
                    refill: float = REFILL, check_every: int = CHECK_EVERY, compile: bool = False) -> list[list[int]]:
    """Greedy answers, in prompt order; each ends at its first end-of-turn token (kept), as the plain path's do.
    `slots` rows decode at once; `width` (data.max_prompt_tokens) sizes the cache, so every call of a run has the
    same shapes and reuses one graph. `compile` (data.compile_decode) runs the step through torch.compile before
    its capture: once a process, since later calls of the same shapes reuse the compiled, captured step."""
    if not prompts:
        return []
    if max_new_tokens < 1:
        return [[] for _ in prompts]
    settings = target.model.generation_config
    extras = {k: v for k in GREEDY_PROCESSORS if (v := getattr(settings, k, None)) not in (None, 0, 1.0, [], {})}
    if extras:
        raise ValueError(f"data.generator: graphs decodes by plain argmax, but the target's generation_config sets "
                         f"{extras}, which plain generate applies; use data.generator=plain")
    longest = max(len(p) for p in prompts)
    if longest > width:
        raise ValueError(f"data.max_prompt_tokens: a prompt has {longest} tokens, more than the cache width {width}")
    with slot_attention(target.model):
        state = _decode_slots(target, min(slots, len(prompts)), cache_columns(width, max_new_tokens), max_new_tokens,
                              compile)
        return _Schedule(state, prompts, refill, check_every).run()


def release() -> None:
    """Frees the kept slots (KV cache, CUDA graph and its memory pool, the model reference) when generation is over."""
    _drop_slots()
    _compiles.clear()


def compile_metrics() -> dict[str, float]:
    """generate/decode_compile_s (building the compiled steps since release()) and generate/decode_compile_cached
    (1 when each came from torch.compile's on-disk cache: the decode warm-up's or an earlier run's); {} when none."""
    if not _compiles:
        return {}
    return {"generate/decode_compile_s": round(sum(seconds for seconds, _ in _compiles), 2),
            "generate/decode_compile_cached": float(all(cached for _, cached in _compiles))}


def _drop_slots() -> None:
    global _slots
    _slots = None
    gc.collect()  # DecodeSlots holds its own bound step function (a reference cycle): dropping it is not enough


def decode_mode() -> str:
    """How the kept slots decode: "graph" (a replayed CUDA graph), "eager" (CPU, or a failed capture), plus
    "+compiled" when torch.compile built the step; "none" before any call."""
    if _slots is None:
        return "none"
    return ("graph" if _slots.graph is not None else "eager") + ("+compiled" if _slots.compiled else "")


def _decode_slots(target, batch: int, columns: int, max_new_tokens: int, compile: bool) -> DecodeSlots:
    global _slots
    eos, pad = list(target.eos_token_ids), target.tokenizer.pad_token_id
    shape = (batch, columns, max_new_tokens, sorted(set(eos)), pad, compile)
    if _slots is None or _slots.model is not target.model or _slots.key != shape:
        _drop_slots()  # frees the previous cache and graph before the new ones are allocated
        state = DecodeSlots(target.model, batch, columns, max_new_tokens, eos, pad, compile)
        state.key = shape
        state.capture()
        if state.compiled:  # (a failed compile is its own warning, and the step runs uncompiled)
            _compiles.append((state.compile_seconds, state.compile_cached))
        _slots = state
    return _slots


class _Schedule:
    def __init__(self, state: DecodeSlots, prompts: list[list[int]], refill: float, check_every: int):
        self.state, self.prompts, self.check_every = state, prompts, max(1, int(check_every))
        self.queue = deque(sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i)))
        self.threshold = max(1, math.ceil(state.batch * refill))
        self.owner = [-1] * state.batch   # the prompt each slot is answering, -1 when free
        self.started = [0] * state.batch  # the step count when it started
        self.answers: list[list[int] | None] = [None] * len(prompts)

    def run(self) -> list[list[int]]:
        state = self.state
        state.reset()
        while True:
            self._collect()
            free = [s for s, owner in enumerate(self.owner) if owner < 0]
            if self.queue and len(free) >= min(self.threshold, len(self.queue)):
                self._fill(free[:len(self.queue)])
                continue  # a first token may already end an answer
            busy = [s for s, owner in enumerate(self.owner) if owner >= 0]
            if not busy:
                break
            # the first slot to reach max_new_tokens does so after this many more steps (its first token came
            # from the prefill)
            to_cap = min(state.max_new - 1 - (state.steps - self.started[s]) for s in busy)
            state.advance(max(1, min(self.check_every, to_cap)))
        missing = [i for i, answer in enumerate(self.answers) if answer is None]
        if missing:
            raise RuntimeError(f"generate: graphs: {len(missing)} prompts got no answer (first: {missing[0]})")
        return self.answers

    def _collect(self) -> None:
        done = self.state.done.tolist()  # the one read-back: waits for the replayed steps
        finished = [s for s, owner in enumerate(self.owner) if owner >= 0 and done[s]]
        if not finished:
            return
        for slot, answer in zip(finished, self.state.answers(finished)):
            self.answers[self.owner[slot]] = answer
            self.owner[slot] = -1

    def _fill(self, slots: list[int]) -> None:
        chosen = [self.queue.popleft() for _ in slots]
        self.state.load(slots, [self.prompts[i] for i in chosen])
        for slot, index in zip(slots, chosen):
            self.owner[slot], self.started[slot] = index, self.state.steps

"""The fast generation paths: `data.generator=static` (HF generate with a static KV cache, compiled into CUDA
graphs on a GPU) and `data.generator=continuous` (transformers' continuous batching). `data.generator=graphs`
(our own CUDA-graph decode loop with refilled slots) lives in graphgen.py.

static: `generate(cache_implementation="static")` allocates the KV cache once and, on CUDA, transformers compiles
the decode step (torch.compile, CUDA graphs). Every batch is left-padded to `data.max_prompt_tokens`, so every
batch has the same shapes and the step compiles once, not once per prompt width. Left padding under the attention
mask changes no answer in exact arithmetic; in fp32 the answers equal the plain path's (tests/unit/test_fastgen.py).

continuous:
`generate_batch` of transformers keeps a paged KV cache allocated once (a static cache: no per-step growth), can
capture the decode step as a CUDA graph (with flash attention: see below), and refills a finished row with
the next waiting prompt, so the batch stays full instead of idling until its longest answer ends. Up to
`data.batch_size` answers are in flight at once.

Same answers as the plain path (generation/plain.py `generate_batch`): greedy decoding of each prompt alone does not
depend on its batch neighbours in exact arithmetic, so in fp32 the answers are equal token for token (tests/unit/
test_fastgen.py on the CPU). In bf16 they are not bit-equal: a row's matmuls and attention are reduced in another
order (other batch shapes, paged attention instead of left-padded SDPA), and where two logits are closer than bf16's
resolution the argmax can flip; from there the two answers diverge. Both are exact greedy answers of the bf16
model up to rounding, so the training data is as good; it is not the same bytes, which is why `data.generator` is
part of the generate stage's key.

On the H200 continuous batching ran at 0.27x the plain path: without the flash-attention package
transformers turns its CUDA graphs off (an attention mask is needed) and runs paged SDPA eagerly. It stays an
option for machines with flash attention. Sampling (`data.temperature > 0`) stays on the plain path: its seeding
per batch is what makes a resumed pool equal an uninterrupted one, and the order in which continuous batching
draws random numbers depends on scheduling.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("draftlab.generate")


def generate_static(target, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                    width: int) -> list[list[int]]:
    """The plain path's answers (generation/plain.py `generate_batch`) with a static cache, prompts padded to
    `width`."""
    from draftlab.generation.plain import generate_batch

    return generate_batch(target, prompts, max_new_tokens, temperature, width=width, cache_implementation="static")


@torch.inference_mode()
def generate_continuous(target, prompts: list[list[int]], max_new_tokens: int, slots: int,
                        compile_level: int = 0) -> list[list[int]]:
    """Greedy answers, in prompt order; each ends at its first end-of-turn token (kept), as the plain path's do."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    if not prompts:
        return []
    gen = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(target.eos_token_ids),
                           pad_token_id=target.tokenizer.pad_token_id)
    sizing = {}
    if target.device.type != "cuda":
        # transformers sizes the paged cache from free accelerator memory; on a CPU that is most of the RAM (15 s
        # to allocate for a test). Give it what `slots` rows of the longest prompt + answer need instead.
        longest = max(len(p) for p in prompts) + max_new_tokens
        sizing = {"page_size": 64, "num_blocks": int(slots) * -(-longest // 64) + 1,
                  "max_batch_tokens": max(256, longest)}
    cb = ContinuousBatchingConfig(max_requests_per_batch=int(slots), default_compile_level=int(compile_level),
                                  seed=0, **sizing)
    results = target.model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb,
                                          progress_bar=False)
    # request ids are assigned in input order; map them back by the prompt each result carries as a check
    ordered = sorted(results.values(), key=lambda r: _request_number(r.request_id))
    if len(ordered) != len(prompts):
        raise RuntimeError(f"continuous batching returned {len(ordered)} answers for {len(prompts)} prompts")
    eos = set(target.eos_token_ids)
    answers = []
    for prompt, result in zip(prompts, ordered):
        if result.error:
            raise RuntimeError(f"continuous batching failed on request {result.request_id}: {result.error}")
        if list(result.prompt_ids) != list(prompt):
            raise RuntimeError(f"continuous batching: request {result.request_id} does not hold its prompt")
        answer = []
        for token in result.generated_tokens:
            answer.append(int(token))
            if token in eos:
                break
        answers.append(answer)
    return answers


def _request_number(request_id: str) -> int:
    tail = request_id.rsplit("_", 1)[-1]
    if not tail.isdigit():
        raise RuntimeError(f"continuous batching: unexpected request id {request_id!r}")
    return int(tail)

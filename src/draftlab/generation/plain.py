"""The plain path: a batch of prompts answered by transformers' `generate`, the reference the fast paths match."""

from __future__ import annotations

import torch

from draftlab.target.target import Target


@torch.inference_mode()
def generate_batch(target: Target, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                   width: int | None = None, **generate_kwargs) -> list[list[int]]:
    """Answers a batch of tokenised prompts (left padded, to `width` if given); each answer ends at its first
    end-of-turn token. `generate_kwargs` go to HF generate (draftlab/generation/fastgen.py's static cache)."""
    pad = target.tokenizer.pad_token_id
    width = max([width or 0] + [len(p) for p in prompts])
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        attention[row, width - len(ids):] = 1
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {
        "do_sample": False}
    output = target.model.generate(
        input_ids=input_ids.to(target.device), attention_mask=attention.to(target.device),
        max_new_tokens=max_new_tokens, eos_token_id=target.eos_token_ids, pad_token_id=pad, **sampling,
        **generate_kwargs,
    )
    eos = set(target.eos_token_ids)
    answers = []
    for row in output[:, width:].tolist():
        answer = []
        for token in row:
            answer.append(token)
            if token in eos:
                break
        answers.append(answer)
    return answers

"""Predicted against deployed on the same prompts and positions: the draft teacher-forced on the bench's answers.

Training predicts tau = 1 + sum_j full_acc_j (train/ttt.py): a chain is started at EVERY answer position and the
acceptance is averaged over positions. Deployment counts completion tokens / verify steps: a chain starts only
where the previous one ended (after its accepted drafts and the bonus). Where acceptance varies along an answer,
deployment starts fewer chains in easy stretches (each covers more tokens) than in hard ones, so its average
weighs hard positions more (a harmonic rather than an arithmetic mean of the chain lengths): lower, by definition.

For each bench prompt the target's own answer (the plain decode's) is run through the target once and the draft is
unrolled over it as training unrolls it (its own hidden states, TTTCache: model/draft.py), giving the chain
length at every position. From those chains:
- `tf_tau`: training's definition (positions counted as ttt_unroll counts them: the predicted token is an answer
  token), on the bench's prompts and answer positions (so past the training answers' length too);
- `walk_tau`: deployment's count, walking the chains as the engine does (first chain at the prompt's last
  position, then one past each bonus), truncated at the answer's end as the engine truncates.
In exact arithmetic walk_tau is the engine's own tau on that prompt (tests/unit/test_teacher_forced.py checks fp32), so
predicted - tf_tau is prompts and positions, tf_tau - walk_tau the definition, walk_tau - bench tau numerics.
"""

from __future__ import annotations

import torch

from draftlab.model.draft import TTTCache


@torch.inference_mode()
def chain_lengths(target_model, draft_model, feature_layers, prompt: list[int], answer: list[int], k: int):
    """(correct [k, T] bool: step j of the chain started at position t predicts x_{t+2+j} as the target's full
    forward does, valid [k, T] bool: x_{t+2+j} is an answer token) over the sequence prompt + answer."""
    device = next(target_model.parameters()).device
    ids = torch.tensor([prompt + answer], dtype=torch.long, device=device)
    T, P = ids.shape[1], len(prompt)
    out = target_model(input_ids=ids, output_hidden_states=True)
    top = out.logits[0].argmax(-1)  # top[s]: the target's choice for x_{s+1}
    features = torch.cat([out.hidden_states[i + 1] for i in feature_layers], -1)
    ids_ext = torch.cat([ids, ids.new_zeros(1, k + 1)], 1)
    positions = torch.arange(T, device=device)[None]
    cache, hidden = TTTCache(len(draft_model.layers)), features
    correct = torch.zeros(k, T, dtype=torch.bool, device=device)
    valid = torch.zeros(k, T, dtype=torch.bool, device=device)
    t = torch.arange(T, device=device)
    for j in range(k):  # as train/ttt.py ttt_unroll: step j reads x_{t+1+j} at rope position t+j
        logits, hidden = draft_model(ids_ext[:, 1 + j: 1 + j + T], hidden, positions + j, cache)
        s = t + 1 + j  # the target position whose choice step j predicts (x_{s+1} = x_{t+2+j})
        inside = s < T - 1
        valid[j] = inside & (s + 1 >= P)
        guess = draft_model.draft_to_target(logits[0].argmax(-1))
        correct[j] = inside & (guess == top[s.clamp(max=T - 1)])
    return correct.cpu(), valid.cpu()


def full_acc_sums(correct: torch.Tensor, valid: torch.Tensor) -> tuple[list[int], list[int]]:
    """Per step j: (positions whose chain got steps 0..j right, positions where step j counts) as ttt_unroll sums
    them (`chain` and `valid`, valid cumulative over steps)."""
    chain_ok = torch.cumprod(correct.long(), 0).bool()
    valid_all = torch.cumprod(valid.long(), 0).bool()
    return ((chain_ok & valid_all).sum(1).tolist(), valid_all.sum(1).tolist())


def walk(correct: torch.Tensor, prompt_len: int, answer_len: int) -> tuple[int, int]:
    """(tokens, verify steps) of the engine's walk over the chains: the prefill gives the first answer token,
    the first chain starts at position prompt_len - 1, each step commits its accepted drafts and the bonus."""
    k = correct.shape[0]
    tokens, steps, t = 1, 0, prompt_len - 1
    while tokens < answer_len:
        accepted = 0
        while accepted < k and bool(correct[accepted, t]):
            accepted += 1
        tokens += min(accepted + 1, answer_len - tokens)
        steps += 1
        t += accepted + 1
    return tokens, steps


def prompt_row(target_model, draft_model, feature_layers, prompt: list[int], answer: list[int], k: int) -> dict:
    """The per-prompt numbers both definitions are pooled from."""
    correct, valid = chain_lengths(target_model, draft_model, feature_layers, prompt, answer, k)
    chain, counted = full_acc_sums(correct, valid)
    tokens, steps = walk(correct, len(prompt), len(answer))
    return {"tf_chain": chain, "tf_valid": counted, "walk_tokens": tokens, "walk_steps": steps}


def pooled(rows: list[dict], k: int) -> dict[str, float]:
    """tf_tau = 1 + sum_j (summed chains / summed valid positions), as train/ttt.py summarize pools; walk_tau =
    summed tokens / summed steps, as the bench pools."""
    tf = 1.0
    for j in range(k):
        den = sum(r["tf_valid"][j] for r in rows)
        tf += sum(r["tf_chain"][j] for r in rows) / den if den else 0.0
    steps = sum(r["walk_steps"] for r in rows)
    return {"tf_tau": tf, "walk_tau": sum(r["walk_tokens"] for r in rows) / steps if steps else float("nan")}

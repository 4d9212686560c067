"""Training-time test: the draft unrolled over its own hidden states, the loss, and per-step metrics.

Alignment (ARCHITECTURE.md "Draft alignment"): for position t and step j the draft reads
(hidden from step j-1 at t, or the target features f_t at step 0; embed(x_{t+1+j})) at rope position t+j and is
trained against the target distribution at position s = t+1+j, which predicts x_{t+2+j}.

Which positions count: (t, j) counts when the predicted token x_{t+2+j} exists and is an assistant token
(loss_mask); positions whose target top-1 lies outside the draft vocab are dropped from the loss (SpecForge's
position_mask) but stay in the accuracy denominators as misses, and their share is reported.

Metrics (numerators and denominators are summed over batches before any ratio is formed):
- acc_j: teacher-forced top-1 match of d2t(draft argmax) with the target argmax (EAGLE/SpecForge);
- full_acc_j: P(steps 0..j all correct) = P(accept >= j+1) of a chain started at t (speculators);
- cond_acc_j: P(step j correct | steps 0..j-1 correct);
- predicted_tau = 1 + sum_{j < num_steps} full_acc_j (reference section 6).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from draftlab.model.draft import Eagle3Draft, TTTCache
from draftlab.train.compile_choice import compile_wanted

# rows of the stats tensor [len(STATS), steps]; all are sums over positions
STATS = ("ce", "n_loss", "correct", "n", "chain", "valid", "chain_prev", "oov")
_ROW = {name: i for i, name in enumerate(STATS)}
log = logging.getLogger("draftlab")


@dataclass
class Targets:
    probs: Tensor  # [B, T, Vd] float32: target softmax at position s over the draft vocab, renormalised
    top: Tensor  # [B, T] long: target argmax over the full vocab
    in_vocab: Tensor  # [B, T] bool: that argmax is in the draft vocab


@torch.no_grad()
def target_distribution(last_hidden: Tensor, lm_head: Tensor, d2t: Tensor, t2d: Tensor, chunk: int = 2048,
                        top: Tensor | None = None) -> Targets:
    """The teacher's soft targets over the draft vocabulary (fp32, renormalised) and its full-vocabulary argmax
    (`teacher_logits`, which says what `top` saves)."""
    logits, top = teacher_logits(last_hidden, lm_head, d2t, chunk, top)
    wide = logits.float()  # once: soft_targets' own upcast is then a no-op
    # by the packed unroll's formula (`soft_targets`), so that both unrolls train on the very same values
    return Targets(soft_targets(wide, wide.logsumexp(-1)), top, t2d[top])


def soft_targets(logits: Tensor, lse: Tensor) -> Tensor:
    """The teacher's soft targets (fp32): softmax(logits) over the last dimension, formed as exp(logits - lse) from
    its logits (any dtype) and their fp32 logsumexp `lse`: the form train/packed.py `RowTargets` keeps them in."""
    return (logits.float() - lse[..., None]).exp()


@torch.no_grad()
def teacher_logits(last_hidden: Tensor, lm_head: Tensor, d2t: Tensor, chunk: int = 2048,
                   top: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The target's logits over the draft vocabulary, last_hidden @ lm_head[draft ids].T [..., Vd] in lm_head's
    dtype, and its argmax over the full vocabulary [...] (long).

    `top` (that argmax, stored by extract as `target_top`) selects the fast path: only the draft-vocabulary rows of
    lm_head are multiplied, a matmul smaller by vocab / draft vocab (6x for SmolLM2, where the full one was 27.6% of
    a training step). Without it the full logits are formed for the argmax, in row chunks of `chunk` so that a 128k
    vocabulary never needs [positions, vocab] at once."""
    *lead, hidden = last_hidden.shape
    draft_ids = (torch.arange(len(d2t), device=d2t.device) + d2t).to(lm_head.device)
    flat = last_hidden.reshape(-1, hidden)
    if top is not None:
        head = lm_head.index_select(0, draft_ids)  # [Vd, H]: 8192 x 576 for SmolLM2, cheap
        # one matmul: its output is all kept anyway, and under torch.compile a chunk count would be a guard
        logits = flat.to(head.dtype) @ head.T
        top = top.to(device=last_hidden.device, dtype=torch.long).reshape(-1)
    else:
        logits, tops = [], []
        for rows in flat.split(chunk):
            full = rows.to(lm_head.dtype) @ lm_head.T
            tops.append(full.argmax(-1))
            logits.append(full[:, draft_ids])
        logits, top = torch.cat(logits), torch.cat(tops)
    return logits.view(*lead, -1), top.view(lead)


def soft_ce_rows(lg: Tensor, p: Tensor) -> Tensor:
    """The soft cross-entropy -sum_v p log softmax(lg) at each position [...], in fp32 whatever lg's dtype. Written
    as logsumexp(lg) - sum p*lg (p sums to 1): no log_softmax copy."""
    lg = lg.float()
    return torch.logsumexp(lg, -1) - (p * lg).sum(-1)


def soft_ce(lg: Tensor, p: Tensor, w: Tensor, ce=soft_ce_rows) -> Tensor:
    """The soft cross-entropy summed over the positions `w`; `ce` is `soft_ce_rows` or its compiled form."""
    return torch.where(w, ce(lg, p), 0.0).sum()  # where, not multiply: a NaN on a padded row stays out


@functools.cache
def compiled_soft_ce_rows():
    """`soft_ce_rows` under torch.compile (one per process, shapes dynamic). On a GPU the loss over [positions, draft
    vocab] is a chain of memory-bound passes in eager mode (upcast, max, exp, sum, product, and as many in
    backward): fused, it reads the logits and soft targets about once each way."""
    return torch.compile(soft_ce_rows, dynamic=True)


def soft_ce_for(compile_loss: str, device: torch.device, dtype: torch.dtype):
    """train.compile_loss: auto = the compiled soft cross-entropy on CUDA (1.27x a SmolLM2-shaped step on an
    H200), the eager one elsewhere (a CPU step is matmul-bound, and compiling costs seconds). Either is a
    row-wise `ce(lg, p)` (`soft_ce_rows`), what the unrolls' `ce` argument takes.

    The compiled loss is built here, on tiny logits of the training dtype, forward and backward, with and without
    grad (the evaluation pass): a machine where torch.compile cannot build it (no Triton, no C++ compiler) trains
    with the eager loss and says so, before the first batch rather than in the middle of a step."""
    if not compile_wanted("train.compile_loss", compile_loss, device):
        return soft_ce_rows
    fused = compiled_soft_ce_rows()
    try:
        # [rows, vocab] as the eager packed unroll passes them, so the graphs built here are the ones it replays (a
        # compiled unroll traces soft_ce_rows into its own graph); two sizes: the dynamic-shape graph, not one
        # specialised to the first
        for rows in (3, 5):
            lg = torch.randn(rows, 16, device=device).to(dtype).requires_grad_(True)
            p = torch.rand(rows, 16, device=device).softmax(-1)
            fused(lg, p).sum().backward()
            with torch.no_grad():
                fused(lg, p)
    except Exception as error:  # any failure to build or run it: the eager loss gives the same values
        log.warning("train: torch.compile of the loss failed (%s: %s); training with the eager loss "
                    "(train.compile_loss=false skips the attempt)", type(error).__name__, str(error)[:300])
        return soft_ce_rows
    return fused


def step_loss(lg: Tensor, p: Tensor, w: Tensor, j: int, decay: float, loss_norm: Tensor | None,
              ce=soft_ce_rows) -> tuple[Tensor, Tensor, Tensor]:
    """Step j's share of the loss over logits `lg` [..., Vd] against soft targets `p` at the positions `w`;
    returns (decay**j * ce_sum / positions, ce_sum, n_loss). `loss_norm[j]`, when given, is the denominator;
    `ce` is `soft_ce_rows` or its compiled form."""
    n_loss = w.sum()
    ce_sum = soft_ce(lg, p, w, ce)
    return step_term(ce_sum, n_loss, j, decay, loss_norm), ce_sum, n_loss


def step_term(ce_sum: Tensor, n_loss: Tensor, j: int, decay: float, loss_norm: Tensor | None) -> Tensor:
    """Step j's share of the loss from its sums: decay**j * ce_sum over its positions (`loss_norm[j]` when given),
    at least one."""
    denominator = n_loss if loss_norm is None else loss_norm[j]
    return decay**j * ce_sum / denominator.clamp(min=1)


def record_step(row: Tensor, ce_sum: Tensor, n_loss: Tensor, correct, n, chain: Tensor, valid: Tensor,
                prev: Tensor, oov) -> None:
    """Writes one step's sums into its column `row` of the stats tensor (chain/valid/prev: masks to count)."""
    row[_ROW["ce"]] = ce_sum.detach().double()
    row[_ROW["n_loss"]] = n_loss
    row[_ROW["correct"]] = correct
    row[_ROW["n"]] = n
    row[_ROW["chain"]] = chain.sum()
    row[_ROW["valid"]] = valid.sum()
    row[_ROW["chain_prev"]] = prev.sum()
    row[_ROW["oov"]] = oov


def ttt_unroll(model: Eagle3Draft, batch: dict[str, Tensor], targets: Targets, steps: int, decay: float,
               return_logits: bool = False, loss_norm: Tensor | None = None, ce=soft_ce_rows):
    """Runs `steps` draft steps; returns (loss, stats [len(STATS), steps] float64[, per-step logits]).
    `loss_norm` [steps]: the loss positions per step to divide by (default: this batch's own); data-parallel
    training passes the count over all ranks' shares, so that the ranks' losses add up to the whole batch's.
    `ce`: the row-wise soft cross-entropy (`soft_ce_rows` or `compiled_soft_ce_rows()`)."""
    ids, feats = batch["input_ids"], batch["features"]
    B, T = ids.shape
    dev = ids.device
    # the mask of the predicted token x_{t+2+j}, zero past the end of the sequence
    counted = (batch["loss_mask"] & batch["attention_mask"]).bool()
    counted = torch.cat([counted, counted.new_zeros(B, steps + 2)], 1)
    ids_ext = torch.cat([ids, ids.new_zeros(B, steps + 1)], 1)
    positions = torch.arange(T, device=dev).expand(B, T)
    cache = TTTCache(len(model.layers))
    stats = torch.zeros(len(STATS), steps, dtype=torch.float64, device=dev)
    loss = torch.zeros((), device=dev)
    hidden = feats
    valid = torch.ones(B, T, dtype=torch.bool, device=dev)
    chain = torch.ones(B, T, dtype=torch.bool, device=dev)
    all_logits = []
    for j in range(steps):
        logits, hidden = model(ids_ext[:, 1 + j : 1 + j + T], hidden, positions + j, cache)
        n = T - 1 - j  # positions t that still have a target inside the sequence
        if return_logits:
            all_logits.append(logits)
        if n <= 0:
            continue
        lg = logits[:, :n]  # in the autocast dtype: soft_ce upcasts, and the argmax of the upcast is the same
        p = targets.probs[:, 1 + j : 1 + j + n]
        m = counted[:, 2 + j : 2 + j + n]
        w = m & targets.in_vocab[:, 1 + j : 1 + j + n]
        term, ce_sum, n_loss = step_loss(lg, p, w, j, decay, loss_norm, ce)
        loss = loss + term
        with torch.no_grad():
            correct = model.draft_to_target(lg.argmax(-1)) == targets.top[:, 1 + j : 1 + j + n]
            valid = valid[:, :n] & m
            prev = chain[:, :n] & valid
            chain = prev & correct
            record_step(stats[:, j], ce_sum, n_loss, (correct & m).sum(), m.sum(), chain, valid, prev,
                        (m & ~targets.in_vocab[:, 1 + j : 1 + j + n]).sum())
    if return_logits:
        return loss, stats, all_logits
    return loss, stats


def summarize(stats: Tensor, decay: float, num_steps: int) -> dict[str, float]:
    """Turns summed stats into metrics (no prefix): loss, ploss_j, acc_j, full_acc_j, cond_acc_j, predicted_tau,
    out_of_vocab_frac. predicted_tau sums the first min(num_steps, ttt_steps) full_acc_j."""
    s = stats.double().cpu()

    def ratio(num: Tensor, den: Tensor) -> Tensor:
        return torch.where(den > 0, num / den.clamp(min=1), torch.zeros_like(num))

    r = {name: s[i] for i, name in enumerate(STATS)}
    ploss = ratio(r["ce"], r["n_loss"])
    acc, full, cond = ratio(r["correct"], r["n"]), ratio(r["chain"], r["valid"]), ratio(r["chain"], r["chain_prev"])
    steps = s.shape[1]
    out = {"loss": float(sum(decay**j * ploss[j] for j in range(steps)))}
    for j in range(steps):
        out[f"ploss_{j}"] = float(ploss[j])
        out[f"acc_{j}"] = float(acc[j])
        out[f"full_acc_{j}"] = float(full[j])
        out[f"cond_acc_{j}"] = float(cond[j])
    out["predicted_tau"] = 1.0 + float(full[: min(num_steps, steps)].sum())
    out["out_of_vocab_frac"] = float(ratio(r["oov"][:1], r["n"][:1])[0])
    out["tokens"] = float(r["n"][0])
    return out

"""The TTT unroll computed only at the positions that count: the same loss, gradients and stats as
`ttt.ttt_unroll`, with fewer FLOPs.

Most of a step is matmuls over every position of the padded batch: the draft layer, its draft-vocabulary head
and the teacher's head rows (84% of a CPU step is `aten::mm`). But a position t only matters
when some step j predicts an answer token there (`counted[t+2+j]`): prompt tokens and padding (about 40% of a
ShareGPT batch) feed the loss only as keys of step 0's attention. So:
- the teacher's soft targets are formed only at positions s whose next token counts (s = t+1+j);
- step 0 computes the keys and values of every position, and everything after them (query, attention output,
  o_proj, MLP, norm, head) only at the kept rows K = {t : some step j counts at t};
- steps j >= 1 run entirely on K (their keys are the diagonal ones at the query's own position);
- the head and the loss run only on the rows whose prediction counts at each step, all steps in one matmul.
Attention keeps the padded [B, heads, T, dim] layout (kept rows scattered in, zeros elsewhere) so that the
draft's own `causal_attention`/`ttt_attention` run unchanged; it is a few percent of the step.

The layer wiring below mirrors `model.draft.DecoderLayer`/`Attention` on rows; tests/unit/test_packed_unroll.py
proves loss, gradients and stats equal to the padded unroll.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from draftlab.model.draft import Eagle3Draft, TTTCache, _rotate_half
from draftlab.train.ttt import (STATS, record_step, soft_ce_rows, soft_targets, step_term, target_distribution,
                                teacher_logits, ttt_unroll)


class Rows:
    """Flat indices `index` into a [B, T] grid, with gather ([B, T, C] -> [N, C]) and scatter back."""

    def __init__(self, index: Tensor, shape: tuple[int, int]) -> None:
        self.B, self.T = shape
        self.index = index
        self.b, self.t = index // self.T, index % self.T

    def __len__(self) -> int:
        return len(self.index)

    def gather(self, full: Tensor) -> Tensor:
        return full.reshape(self.B * self.T, -1).index_select(0, self.index)

    def scatter(self, rows: Tensor) -> Tensor:
        full = rows.new_zeros(self.B * self.T, rows.shape[-1])
        return full.index_copy(0, self.index, rows).view(self.B, self.T, -1)


@dataclass
class PackedPlan:
    """Where the packed unroll computes, listed from the batch's masks alone: the kept rows, the positions whose
    teacher is needed, and the (step, kept row) pairs each step trains on, sorted by step. The trainer builds it on
    the host from the batch it read, and `to` sends it in one pinned copy: listing these on the GPU (a `nonzero`
    each, and a count) made the host wait for the GPU to drain before it could queue the rest of the step."""

    shape: tuple[int, int]  # B, T
    kept: Tensor  # [N] flat indices: some step counts at t
    needed: Tensor  # [N_s] flat indices s: the next token counts (the teacher's rows)
    step_of: Tensor  # [M] the step of each trained pair
    row_of: Tensor  # [M] its kept row (an index into kept)
    sizes: list[int]  # pairs per step
    real: Tensor  # [M] bool: the pair trains (false for the filler of a `padded` plan)
    counted: int  # kept rows that some step counts at (len(kept) less a padded plan's filler)

    @classmethod
    def of(cls, loss_mask: Tensor, attention_mask: Tensor, steps: int) -> PackedPlan:
        B, T = loss_mask.shape
        counted = (loss_mask & attention_mask).bool()
        counted = torch.cat([counted, counted.new_zeros(B, steps + 2)], 1)
        # step j at position t predicts x_{t+2+j}: hits[j, t] says it counts; keep t when any step counts there.
        # Few, whole-batch ops: on the host each small op can cost more in intra-op threading than in work.
        hits = torch.stack([counted[:, 2 + j : 2 + j + T] for j in range(steps)]).view(steps, B * T)
        kept = hits.any(0).nonzero().squeeze(1)
        needed = counted[:, 1 : T + 1].reshape(-1).nonzero().squeeze(1)
        step_of, row_of = hits.index_select(1, kept).nonzero().unbind(1)
        sizes = torch.bincount(step_of, minlength=steps).tolist()
        real = torch.ones(len(step_of), dtype=torch.bool, device=step_of.device)
        return cls((B, T), kept, needed, step_of, row_of, sizes, real, len(kept))

    def padded(self, multiple: int) -> PackedPlan:
        """The same plan with every count (kept rows, teacher rows, pairs of each step) raised to one capacity, a
        multiple of `multiple` (at most the batch's positions), so that batches of similar sizes share every size:
        what a CUDA graph is recorded for (train/compiled_unroll.py). The filler changes no loss, gradient or stat
        (tests/unit/test_packed_unroll.py): extra kept and teacher rows are positions that nothing counts at (computed,
        never read: attention is causal and a later step's keys are read only at their own row), and each step's
        pairs are filled up with the kept rows it does not train on, flagged not `real`."""
        B, T = self.shape
        steps = len(self.sizes)
        capacity = min(-(-max(len(self.kept), len(self.needed), 1) // multiple) * multiple, B * T)
        trains = torch.zeros(steps, capacity, dtype=torch.bool)
        trains[self.step_of, self.row_of] = True
        # per step: its trained rows first, in the plan's order, then the others (a permutation of the kept rows)
        rows = torch.cat([torch.cat([r, (~t).nonzero().squeeze(1)]) for r, t in
                          zip(self.row_of.split(self.sizes), trains)])
        real = torch.cat([torch.arange(capacity) < n for n in self.sizes])
        return PackedPlan(self.shape, _fill(self.kept, capacity, B * T), _fill(self.needed, capacity, B * T),
                          torch.arange(steps).repeat_interleave(capacity), rows, [capacity] * steps, real, self.counted)

    def to(self, device: torch.device) -> PackedPlan:
        parts = [self.kept, self.needed, self.step_of, self.row_of, self.real.long()]
        flat = torch.cat(parts)  # one copy, always the same path (tests/unit/test_packed_unroll.py checks its fields)
        if device.type == "cuda" and flat.device.type == "cpu":
            flat = flat.pin_memory()  # a pageable source makes the copy wait for the stream
        *flat, real = flat.to(device, non_blocking=True).split([len(x) for x in parts])
        return PackedPlan(self.shape, *flat, self.sizes, real.bool(), self.counted)


def _fill(index: Tensor, size: int, positions: int) -> Tensor:
    """`index` (distinct flat positions) followed by the first positions not in it, `size` in all."""
    free = torch.ones(positions, dtype=torch.bool)
    free[index] = False
    return torch.cat([index, free.nonzero().squeeze(1)[: size - len(index)]])


# rows of the teacher's full-vocabulary logits formed at once for a pool without `target_top` (ttt.teacher_logits):
# bounds a [rows, vocab] temporary for a 128k vocabulary
TEACHER_CHUNK = 2048


class RowTargets:
    """The teacher at `rows`, the positions s whose next token counts: its draft-vocabulary logits [N_s, Vd] in
    lm_head's dtype and their logsumexp `lse` [N_s] (fp32), with `row` [B, T] (-1 elsewhere) mapping a position to
    its row, and the full-vocabulary argmax `top` / `in_vocab` [B, T]. `probs_at` forms the soft targets of the
    rows a step reads, where the loss reads them.

    Why logits and not probabilities: in a bf16 run they are half the bytes, and the values are the same up to
    fp32 rounding (both are the fp32 softmax of the bf16 logits). On an H200 the whole trainer ran 1.085x faster
    this way than with fp32 probabilities gathered by every step. In a profiled step the loss's kernels took 3.2 ms
    less: the forward's fused reductions 2.0 ms where, with the softmax in them, they took 8.0; the backward's
    pointwise kernel, which forms the targets again, 4.7 ms where it took 1.9, since it computed every step's
    branch per element (`_pair_ce` says why, and how the loss is now formed)."""

    def __init__(self, last_hidden: Tensor, lm_head: Tensor, d2t: Tensor, t2d: Tensor, rows: Rows,
                 top: Tensor | None = None) -> None:
        self.logits, top_rows = teacher_logits(rows.gather(last_hidden), lm_head, d2t, TEACHER_CHUNK,
                                               top=None if top is None else rows.gather(top[..., None])[:, 0])
        self.lse = self.logits.float().logsumexp(-1)
        shape, dev = (rows.B, rows.T), last_hidden.device
        self.row = torch.full(shape, -1, dtype=torch.long, device=dev)
        self.row.view(-1)[rows.index] = torch.arange(len(rows), device=dev)
        self.top = torch.zeros(shape, dtype=torch.long, device=dev)
        self.top.view(-1)[rows.index] = top_rows
        self.in_vocab = t2d[self.top]

    def probs_at(self, index: Tensor) -> Tensor:
        return soft_targets(self.logits.index_select(0, index), self.lse.index_select(0, index))


def _attention(attn, h_q: Tensor, h_kv: Tensor, rows: Rows, cos: Tensor, sin: Tensor, cache: TTTCache,
               layer: int) -> Tensor:
    """`Attention.forward` with queries at `rows` only; keys/values from h_kv, either [B, T, in] (every
    position: step 0) or [N, in] (the kept rows: steps >= 1, whose keys are only read at their own position)."""
    B, T = rows.B, rows.T

    def heads(x: Tensor, n: int) -> Tensor:
        return x.view(B, T, n, attn.hd).transpose(1, 2)

    q = heads(rows.scatter(attn.q_proj(h_q)), attn.nh)
    k, v = attn.k_proj(h_kv), attn.v_proj(h_kv)
    if h_kv.dim() == 2:
        k, v = rows.scatter(k), rows.scatter(v)
    k, v = heads(k, attn.nkv), heads(v, attn.nkv)
    q = (q * cos + _rotate_half(q) * sin).to(v.dtype)
    k = (k * cos + _rotate_half(k) * sin).to(v.dtype)
    y = cache.attend(layer, q, k, v)
    return attn.o_proj(rows.gather(y.transpose(1, 2).reshape(B, T, attn.nh * attn.hd)))


def _layer(layer, x: Tensor, residual: Tensor | None, emb: Tensor, rows: Rows, cos: Tensor, sin: Tensor,
           cache: TTTCache) -> tuple[Tensor, Tensor]:
    """`DecoderLayer.forward` whose output is computed at `rows` only. Inputs are [B, T, *] at step 0 (the norms
    and keys/values then cover every position) and [N, *] rows at later steps; outputs are [N, *] rows."""
    if layer.index == 0:
        residual = x
        h = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(x)], -1)
    else:
        residual = x + residual
        h = layer.hidden_norm(residual)
    h_kv = h
    if h.dim() == 3:
        h, residual = rows.gather(h), rows.gather(residual)
    residual = _attention(layer.self_attn, h, h_kv, rows, cos, sin, cache, layer.index) + residual
    return layer.mlp(layer.post_attention_layernorm(residual)), residual


def _step0(model: Eagle3Draft, ids: Tensor, feats: Tensor, positions: Tensor, rows: Rows,
           cache: TTTCache) -> Tensor:
    """Step 0 (`Eagle3Draft.forward` over the sequence); returns the next hidden state [N, H] at the kept rows.
    Layers before the last run at every position: the next layer's keys need them all."""
    emb, hidden, cos, sin = model.step_inputs(ids, feats, positions)
    x, residual = hidden, None
    for layer in model.layers[:-1]:
        x, residual = layer(x, residual, emb, cos, sin, cache)
    x, residual = _layer(model.layers[-1], x, residual, emb, rows, cos, sin, cache)
    return x + residual


def _step(model: Eagle3Draft, ids: Tensor, hidden: Tensor, cos: Tensor, sin: Tensor, rows: Rows,
          cache: TTTCache) -> Tensor:
    """Step j >= 1 on the kept rows: ids [N], hidden [N, H], and RoPE at positions t + j ([1, 1, T, head_dim])."""
    emb = model.embed_tokens(ids)
    x, residual = hidden, None
    for layer in model.layers:
        x, residual = _layer(layer, x, residual, emb, rows, cos, sin, cache)
    return x + residual


def _pair_ce(ce, logits: Tensor, targets: RowTargets, teacher: Tensor, sizes: list[int]) -> Tensor:
    """The soft cross-entropy of every pair [M] (`ce`, row-wise) against its teacher row.

    Compiled, in one pass over [pairs, draft vocab]. Taken step by step, the gradient of the head's logits was one
    pointwise kernel over their concatenation in which every element computed every step's branch (Inductor fuses a
    `cat` of computed inputs that way): on the H200 that kernel took 4.7 ms of a 20.9 ms step
    (benchmarks/loss_kernel.py times the forms). Eager, step by step: each step's temporaries are a seventh of the size,
    and on two CPU cores the whole unroll ran 1.7x slower with them at once, its elementwise passes no longer in the
    caches. An eager unroll on a GPU (eager validation, a one-row batch, train.compile_unroll=false) also goes step
    by step: the same values; its speed there not measured."""
    if torch.compiler.is_compiling():
        return ce(logits, targets.probs_at(teacher))
    return torch.cat([ce(lg, targets.probs_at(t)) for lg, t in zip(logits.split(sizes), teacher.split(sizes))])


def packed_unroll(model: Eagle3Draft, batch: dict[str, Tensor], lm_head: Tensor, steps: int, decay: float,
                  loss_norm: Tensor | None = None, ce=soft_ce_rows, max_kept: float = 1.0,
                  plan: PackedPlan | None = None, core=None) -> tuple[Tensor, Tensor]:
    """`ttt_unroll(model, batch, target_distribution(...), steps, decay)` at the positions that count; returns
    (loss, stats [len(STATS), steps] float64). `lm_head` is the target head (the teacher), `ce` the row-wise soft
    cross-entropy (`soft_ce_rows`, or its compiled form for an eager unroll: a compiled one traces it into its
    graph). When more than `max_kept` of the batch's positions count, the padded unroll runs instead: the gathers
    and scatters then cost more than the positions they save (on a GPU). `plan`: the batch's
    `PackedPlan`, built from its host copy (else here, from its masks, with host syncs on a GPU); with it, the
    unroll has no data-dependent size to read back (tests/unit/test_packed_unroll.py runs it on the meta device).
    `core`: what computes the packed unroll once the plan is on the device (`packed_core`, or its compiled form:
    train/compiled_unroll.py)."""
    ids = batch["input_ids"]
    B, T = ids.shape
    if plan is None:
        plan = PackedPlan.of(batch["loss_mask"], batch["attention_mask"], steps)
    if plan.shape != (B, T):
        raise ValueError(f"packed_unroll: the plan is for a {plan.shape} batch, this batch is {(B, T)}")
    plan = plan.to(ids.device)
    kept = plan.counted
    # nothing counts (the padded unroll gives the zero loss its graph), or too much counts for packing to pay
    if kept == 0 or kept > max_kept * B * T:
        targets = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d, top=batch.get("target_top"))
        return ttt_unroll(model, batch, targets, steps, decay, loss_norm=loss_norm, ce=ce)
    return (core or packed_core)(model, batch, lm_head, plan, steps, decay, loss_norm, ce)


def packed_core(model: Eagle3Draft, batch: dict[str, Tensor], lm_head: Tensor, plan: PackedPlan, steps: int,
                decay: float, loss_norm: Tensor | None, ce) -> tuple[Tensor, Tensor]:
    """The packed unroll proper, given the batch's plan on its device (at least one kept row): straight-line tensor
    code whose sizes all come from the plan's tensors and `sizes`, so one dynamic-shape graph covers every batch."""
    ids, feats = batch["input_ids"], batch["features"]
    B, T = ids.shape
    dev = ids.device
    rows = Rows(plan.kept, (B, T))
    targets = RowTargets(batch["last_hidden"], lm_head, model.d2t, model.t2d, Rows(plan.needed, (B, T)),
                         top=batch.get("target_top"))
    ids_ext = torch.cat([ids, ids.new_zeros(B, steps + 1)], 1)
    positions = torch.arange(T, device=dev).expand(B, T)
    # RoPE for every step at once: step j reads positions t + j (the same values as computing it per step)
    cos_all, sin_all = model.rope(torch.arange(T + steps, device=dev)[None], torch.float32)
    cache = TTTCache(len(model.layers))
    stats = torch.zeros(len(STATS), steps, dtype=torch.float64, device=dev)
    valid = torch.ones(len(rows), dtype=torch.bool, device=dev)
    chain = torch.ones(len(rows), dtype=torch.bool, device=dev)
    # [steps, N]: step j's prediction at each kept row counts; `sels` lists those rows per step
    masks = torch.zeros(steps, len(rows), dtype=torch.bool, device=dev)
    masks[plan.step_of, plan.row_of] = plan.real
    sizes = plan.sizes
    sels, reals = plan.row_of.split(sizes), plan.real.split(sizes)
    hidden, picked = None, []
    for j, sel in enumerate(sels):
        if j == 0:
            hidden = _step0(model, ids_ext[:, 1 : 1 + T], feats, positions, rows, cache)
        else:
            hidden = _step(model, ids_ext[rows.b, rows.t + 1 + j], hidden, cos_all[:, :, j : j + T],
                           sin_all[:, :, j : j + T], rows, cache)
        picked.append(hidden.index_select(0, sel))
    # The next step never reads a step's logits: one head matmul (and one in backward) for every step's pairs, which
    # are listed by step (a step's are a slice of `sizes` rows)
    logits = model.lm_head(model.norm(torch.cat(picked)))
    b = rows.b[plan.row_of]
    # the position whose target distribution each pair is trained against; a filler pair's may lie past the end,
    # or have no teacher row: clamped, and kept out of every sum by `real`
    s = (rows.t[plan.row_of] + 1 + plan.step_of).clamp(max=T - 1)
    in_vocab = targets.in_vocab[b, s]
    trains = in_vocab & plan.real
    ce_rows = torch.where(trains, _pair_ce(ce, logits, targets, targets.row[b, s].clamp(min=0), sizes), 0.0)
    ce_sums = torch.stack([x.sum() for x in ce_rows.split(sizes)])
    n_losses = torch.stack([x.sum() for x in trains.split(sizes)])
    loss = torch.zeros((), device=dev)
    for j in range(steps):
        loss = loss + step_term(ce_sums[j], n_losses[j], j, decay, loss_norm)
    with torch.no_grad():
        hits = (model.draft_to_target(logits.argmax(-1)) == targets.top[b, s]) & plan.real
        per_step = zip(masks, sels, reals, hits.split(sizes), in_vocab.split(sizes))
        for j, (m, sel, real, hit, step_in_vocab) in enumerate(per_step):
            correct = torch.zeros_like(m).index_copy(0, sel, hit)  # sel's rows are distinct
            valid = valid & m
            prev = chain & valid
            chain = prev & correct
            record_step(stats[:, j], ce_sums[j], n_losses[j], hit.sum(), real.sum(), chain, valid, prev,
                        (real & ~step_in_vocab).sum())
    return loss, stats

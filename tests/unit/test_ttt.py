"""Training-time test: alignment, masks, the loss and the metric definitions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftlab.model.draft import DraftModelConfig, Eagle3Draft, KVCache
from draftlab.train.ttt import STATS, summarize, target_distribution, ttt_unroll

H, HT, V, VD, T = 32, 16, 50, 30, 14




def _model(seed=0, layers=1) -> Eagle3Draft:
    torch.manual_seed(seed)
    cfg = DraftModelConfig(hidden_size=H, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=8, target_hidden_size=HT, aux_layer_ids=[0, 1, 2], vocab_size=V,
                           draft_vocab_size=VD, num_hidden_layers=layers)
    model = Eagle3Draft(cfg).eval()
    used = torch.randperm(V, generator=torch.Generator().manual_seed(5))[:VD].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    model.init_from_target(torch.randn(V, H), None, used - torch.arange(VD), t2d)
    return model


def _batch(B=3, seed=1, lengths=(T, T - 3, T - 5)) -> tuple[dict, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.stack([torch.arange(T) < n for n in lengths[:B]])
    loss_mask = mask.clone()
    loss_mask[:, :3] = False
    batch = {"input_ids": torch.randint(0, V, (B, T), generator=g), "features": torch.randn(B, T, 3 * HT, generator=g),
             "last_hidden": torch.randn(B, T, HT, generator=g), "loss_mask": loss_mask, "attention_mask": mask}
    return batch, 3 * torch.randn(V, HT, generator=g)


def test_target_distribution_restricted_and_renormalised():
    model = _model()
    batch, lm_head = _batch()
    tg = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d, chunk=7)
    logits = batch["last_hidden"] @ lm_head.T
    ids = torch.arange(VD) + model.d2t
    assert torch.allclose(tg.probs, logits[..., ids].softmax(-1), atol=1e-6)
    assert torch.equal(tg.top, logits.argmax(-1)) and torch.equal(tg.in_vocab, model.t2d[tg.top])
    assert 0 < (~tg.in_vocab).sum() < tg.in_vocab.numel()  # both cases occur in this batch


def test_one_step_loss_is_plain_soft_cross_entropy():
    model = _model()
    batch, lm_head = _batch()
    tg = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d)
    loss, stats = ttt_unroll(model, batch, tg, steps=1, decay=0.8)
    # by hand: input at t = (f_t, x_{t+1}), target at t+1, counted when x_{t+2} is an in-vocab assistant token
    logits, _ = model(torch.roll(batch["input_ids"], -1, 1), batch["features"], torch.arange(T).expand(3, T))
    logp = F.log_softmax(logits[:, : T - 2], -1)
    p = tg.probs[:, 1 : T - 1]
    w = (batch["loss_mask"] & batch["attention_mask"])[:, 2:] & tg.in_vocab[:, 1 : T - 1]
    ce = -(p * logp).sum(-1)
    assert torch.allclose(loss, ce[w].mean(), atol=1e-5)
    assert stats[STATS.index("n_loss"), 0] == w.sum()


def _step_logits(model, batch, tg, steps):
    with torch.no_grad():
        return ttt_unroll(model, batch, tg, steps=steps, decay=0.8, return_logits=True)[2]


def test_future_inputs_do_not_leak():
    model = _model(layers=2)
    batch, lm_head = _batch(B=1, lengths=(T,))
    tg = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d)
    steps, t0 = 4, 6
    base = _step_logits(model, batch, tg, steps)
    for j in range(steps):
        # step j at positions <= t0 may read features f_{<=t0} and tokens x_{<=t0+1+j} only
        later = {k: v.clone() for k, v in batch.items()}
        later["features"][:, t0 + 1 :] += 3.0
        later["input_ids"][:, t0 + 2 + j :] = (later["input_ids"][:, t0 + 2 + j :] + 7) % V
        out = _step_logits(model, later, tg, steps)
        assert torch.allclose(out[j][:, : t0 + 1], base[j][:, : t0 + 1], atol=1e-5), j
        # and the test can fail: the token the step does read changes its output at t0
        seen = {k: v.clone() for k, v in batch.items()}
        seen["input_ids"][:, t0 + 1 + j] = (seen["input_ids"][:, t0 + 1 + j] + 7) % V
        assert not torch.allclose(_step_logits(model, seen, tg, steps)[j][:, t0], base[j][:, t0], atol=1e-4), j


def test_unroll_equals_sequential_drafting_with_a_kv_cache():
    """The serving engine's view: extend over x_1..x_{t+1} with features, then draft with own hidden states."""
    model = _model(layers=2)
    batch, lm_head = _batch(B=1, lengths=(T,))
    tg = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d)
    steps = 4
    ttt = _step_logits(model, batch, tg, steps)
    ids, feats = batch["input_ids"], batch["features"]
    for t0 in (0, 5, T - 1 - steps):
        cache = KVCache(2)
        with torch.no_grad():
            logits, hidden = model(ids[:, 1 : t0 + 2], feats[:, : t0 + 1], torch.arange(t0 + 1)[None], cache)
            assert torch.allclose(logits[:, -1], ttt[0][:, t0], atol=1e-5)
            hidden = hidden[:, -1:]
            for j in range(1, steps):
                logits, hidden = model(ids[:, t0 + 1 + j : t0 + 2 + j], hidden, torch.tensor([[t0 + j]]), cache)
                assert torch.allclose(logits[:, 0], ttt[j][:, t0], atol=1e-5), (t0, j)


def _bruteforce(correct: torch.Tensor, mask: torch.Tensor, num_steps: int) -> dict:
    """correct, mask: [N, J] per chain start and step."""
    J = correct.shape[1]
    out = {}
    mask = mask.clone()
    valid = torch.cumprod(mask.int(), 1).bool()
    chain = torch.cumprod((correct & mask).int(), 1).bool()
    for j in range(J):
        out[f"acc_{j}"] = (correct[:, j] & mask[:, j]).sum() / mask[:, j].sum()
        out[f"full_acc_{j}"] = (chain[:, j] & valid[:, j]).sum() / valid[:, j].sum()
        prev = valid[:, j] & (chain[:, j - 1] if j else torch.ones_like(valid[:, j]))
        out[f"cond_acc_{j}"] = (chain[:, j] & valid[:, j]).sum() / prev.sum()
    out["predicted_tau"] = 1 + sum(out[f"full_acc_{j}"] for j in range(min(num_steps, J)))
    return {k: float(v) for k, v in out.items()}


def test_metrics_match_their_definitions():
    """Build a draft whose step-j correctness we control, and compare with a brute-force count."""
    model = _model()
    batch, lm_head = _batch(B=3)
    tg = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d)
    steps = 3
    logits = _step_logits(model, batch, tg, steps)
    # plant chains: from random starts t, make the target agree with steps 0..L-1 (L random), so that
    # full_acc / cond_acc are far from 0 and differ from acc
    g = torch.Generator().manual_seed(9)
    preds = [model.draft_to_target(lg.argmax(-1)) for lg in logits]
    for t in range(T - steps):
        if torch.rand((), generator=g) < 0.6:
            for j in range(int(torch.randint(1, steps + 1, (), generator=g))):
                tg.top[:, t + 1 + j] = preds[j][:, t]
    loss, stats = ttt_unroll(model, batch, tg, steps=steps, decay=0.8)
    top = tg.top
    B = top.shape[0]
    correct = torch.zeros(B, T, steps, dtype=torch.bool)
    mask = torch.zeros(B, T, steps, dtype=torch.bool)
    counted = batch["loss_mask"] & batch["attention_mask"]
    for j in range(steps):
        for t in range(T - 1 - j):
            pred = model.draft_to_target(logits[j][:, t].argmax(-1))
            correct[:, t, j] = pred == top[:, t + 1 + j]
            mask[:, t, j] = counted[:, t + 2 + j] if t + 2 + j < T else False
    want = _bruteforce(correct.reshape(-1, steps), mask.reshape(-1, steps), num_steps=2)
    got = summarize(stats, 0.8, num_steps=2)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-6), k
    assert got["full_acc_1"] > 0.05  # non-trivial chains
    assert got["predicted_tau"] == pytest.approx(1 + got["full_acc_0"] + got["full_acc_1"])
    assert got["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)


def test_summarize_on_a_known_chain():
    # 4 chain starts, 3 steps; correctness patterns: TTT, TTF, TFT, FTT (all positions counted)
    pattern = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1]]).bool()
    stats = torch.zeros(len(STATS), 3, dtype=torch.float64)
    row = {n: i for i, n in enumerate(STATS)}
    chain = torch.cumprod(pattern.int(), 1)
    for j in range(3):
        stats[row["correct"], j] = pattern[:, j].sum()
        stats[row["n"], j] = stats[row["valid"], j] = 4
        stats[row["chain"], j] = chain[:, j].sum()
        stats[row["chain_prev"], j] = chain[:, j - 1].sum() if j else 4
    m = summarize(stats, 0.8, num_steps=3)
    assert [m[f"acc_{j}"] for j in range(3)] == [0.75, 0.75, 0.75]
    assert [m[f"full_acc_{j}"] for j in range(3)] == [0.75, 0.5, 0.25]
    assert [m[f"cond_acc_{j}"] for j in range(3)] == pytest.approx([0.75, 2 / 3, 0.5])
    assert m["predicted_tau"] == pytest.approx(2.5)


def test_out_of_vocab_targets_are_masked_and_counted():
    model = _model()
    batch, lm_head = _batch()
    tg = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d)
    loss, stats = ttt_unroll(model, batch, tg, steps=2, decay=0.8)
    r = {n: stats[i] for i, n in enumerate(STATS)}
    assert torch.all(r["n_loss"] + r["oov"] == r["n"]) and r["oov"][0] > 0
    m = summarize(stats, 0.8, 2)
    assert m["out_of_vocab_frac"] == pytest.approx(float(r["oov"][0] / r["n"][0]))
    # changing the target distribution only at out-of-vocab positions leaves the loss unchanged
    tg.probs[~tg.in_vocab] = torch.full((VD,), 1 / VD)
    assert torch.allclose(ttt_unroll(model, batch, tg, steps=2, decay=0.8)[0], loss)


def test_draft_rows_fast_path_equals_the_full_vocab_path():
    """The fast path (full-vocab argmax given, e.g. stored by extract) builds the same targets, loss and stats."""
    model = _model(layers=2)
    batch, lm_head = _batch()
    plain = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d)
    fast = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d, top=plain.top.to(torch.int32))
    assert torch.equal(fast.top, plain.top) and torch.equal(fast.in_vocab, plain.in_vocab)
    assert fast.top.dtype == torch.long
    assert torch.allclose(fast.probs, plain.probs, atol=1e-6, rtol=1e-5)
    loss_plain, stats_plain = ttt_unroll(model, batch, plain, steps=3, decay=0.8)
    loss_fast, stats_fast = ttt_unroll(model, batch, fast, steps=3, decay=0.8)
    assert torch.allclose(loss_fast, loss_plain, atol=1e-6, rtol=1e-6)
    assert torch.allclose(stats_fast, stats_plain, atol=1e-5, rtol=1e-6)
    # the given argmax is what the masks use: a wrong one changes them (so the argument is not ignored)
    wrong = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d, top=(plain.top + 1) % V)
    assert not torch.equal(wrong.in_vocab, plain.in_vocab)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_teacher_logits_are_the_draft_rows_of_the_targets_logits_on_both_paths(dtype):
    """`teacher_logits` gives last_hidden @ lm_head[draft ids].T in lm_head's dtype, shaped as the positions, and the
    full-vocabulary argmax: formed in chunks without `top`, in one matmul with it."""
    from draftlab.train.ttt import teacher_logits

    model = _model()
    batch, lm_head = _batch()
    head = lm_head.to(dtype)
    draft_ids = torch.arange(VD) + model.d2t
    full = batch["last_hidden"].to(dtype) @ head.T
    plain_logits, plain_top = teacher_logits(batch["last_hidden"], head, model.d2t, chunk=4)  # 42 rows: 11 chunks
    fast_logits, fast_top = teacher_logits(batch["last_hidden"], head, model.d2t, top=plain_top.to(torch.int32))
    assert plain_logits.shape == fast_logits.shape == (3, T, VD) and plain_logits.dtype == fast_logits.dtype == dtype
    assert torch.equal(plain_top, full.float().argmax(-1)) and torch.equal(fast_top, plain_top)
    assert fast_top.dtype == torch.long
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    for logits in (plain_logits, fast_logits):
        assert torch.allclose(logits.float(), full[..., draft_ids].float(), **tolerance)


def test_training_reads_the_target_top_only_where_extract_stores_it():
    """extract stores the full-vocabulary argmax only at `read_positions` (s where loss_mask[s+1]) and 0 elsewhere:
    the padded and the packed unroll give bit-identical losses and stats with it as with the argmax everywhere, and
    also with the other positions filled adversarially (a token of the opposite draft-vocab membership: a 0 often
    shares the true argmax's, which would hide a position read but not stored). Flipping any one read position
    changes them, so the positions are not a superset picked to pass."""
    from draftlab.data.features import read_positions
    from draftlab.train.packed import packed_unroll

    model = _model(layers=2)
    batch, lm_head = _batch()
    full = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d).top.to(torch.int32).view(-1)
    masks = [m[:n] for m, n in zip(batch["loss_mask"], batch["attention_mask"].sum(1))]  # each sample's own mask
    index = read_positions(masks, T)
    assert 0 < len(index) < int(batch["attention_mask"].sum())  # prompt and last positions are left out
    inside, outside = int(model.t2d.nonzero()[0]), int((~model.t2d).nonzero()[0])
    opposite = torch.where(model.t2d[full.long()], outside, inside).to(torch.int32)  # the other membership
    stored = torch.zeros_like(full)
    stored[index] = full[index]
    adversarial = opposite.clone()
    adversarial[index] = full[index]

    def run(top):
        with_top = {**batch, "target_top": top.view(batch["input_ids"].shape)}
        tg = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d, top=with_top["target_top"])
        return (ttt_unroll(model, with_top, tg, steps=3, decay=0.8),
                packed_unroll(model, with_top, lm_head, steps=3, decay=0.8))

    reference = run(full)
    for top in (stored, adversarial):
        for (loss_full, stats_full), (loss, stats) in zip(reference, run(top)):
            assert torch.equal(loss_full, loss) and torch.equal(stats_full, stats)
    for position in index.tolist():  # each read position matters
        flipped = adversarial.clone()
        flipped[position] = opposite[position]
        for (loss_full, stats_full), (loss, stats) in zip(reference, run(flipped)):
            assert not (torch.equal(loss_full, loss) and torch.equal(stats_full, stats))

"""The packed TTT unroll (train/packed.py) equals the padded one: loss, every gradient and every stat, in fp32."""

from __future__ import annotations

import pytest
import torch

from draftlab.model.draft import Eagle3Draft
from draftlab.train.packed import PackedPlan, packed_core, packed_unroll
from draftlab.train.ttt import STATS, target_distribution, ttt_unroll

from test_ttt import HT, V, _model  # the same tiny draft (layers= picks the depth)

T = 15


def _batch(seed: int = 1, with_top: bool = True) -> tuple[dict, torch.Tensor]:
    """Padded rows of different lengths; answers in several segments (a multi-turn chat), one row with none."""
    g = torch.Generator().manual_seed(seed)
    lengths = [T, T - 4, 9, T - 1]
    attention = torch.stack([torch.arange(T) < n for n in lengths])
    loss = torch.zeros_like(attention)
    loss[0, 4:8] = loss[0, 10:] = True  # two answer segments
    loss[1, 6:] = True
    loss[3, 3:] = True  # row 2: a prompt only, nothing counts
    batch = {"input_ids": torch.randint(0, V, (4, T), generator=g), "features": torch.randn(4, T, 3 * HT, generator=g),
             "last_hidden": torch.randn(4, T, HT, generator=g), "loss_mask": loss & attention,
             "attention_mask": attention}
    lm_head = 3 * torch.randn(V, HT, generator=g)
    if with_top:
        batch["target_top"] = (batch["last_hidden"] @ lm_head.T).argmax(-1).to(torch.int32)
    return batch, lm_head


def _run(fn, model: Eagle3Draft) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss, stats = fn()
    loss.backward()
    return loss.detach(), stats, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("with_top", [True, False])
def test_packed_unroll_equals_padded_unroll(layers, with_top):
    model = _model(layers=layers)
    batch, lm_head = _batch(with_top=with_top)
    steps = 3

    def padded():
        tg = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d, top=batch.get("target_top"))
        return ttt_unroll(model, batch, tg, steps, 0.8)

    loss_a, stats_a, grads_a = _run(padded, model)
    loss_b, stats_b, grads_b = _run(lambda: packed_unroll(model, batch, lm_head, steps, 0.8), model)
    assert loss_b == pytest.approx(float(loss_a), rel=1e-5)
    assert torch.allclose(stats_b, stats_a, rtol=1e-5, atol=1e-4), (stats_a, stats_b)
    counts = [STATS.index(k) for k in ("n_loss", "correct", "n", "chain", "valid", "chain_prev", "oov")]
    assert torch.equal(stats_b[counts], stats_a[counts])  # the counts are exact
    assert stats_a[STATS.index("oov"), 0] > 0 and stats_a[STATS.index("n"), 2] > 0  # every case occurs
    assert grads_a.keys() == grads_b.keys() and "fc.weight" in grads_a
    for name, grad in grads_a.items():
        assert torch.allclose(grads_b[name], grad, rtol=1e-4, atol=1e-6), name


def test_packed_unroll_with_a_shared_loss_norm_and_decay():
    """The data-parallel denominator and the step decay enter exactly as in the padded unroll."""
    model = _model(layers=1)
    batch, lm_head = _batch(seed=3)
    norm = torch.tensor([40.0, 30.0, 20.0])
    tg = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d, top=batch["target_top"])
    want, _ = ttt_unroll(model, batch, tg, 3, 0.5, loss_norm=norm)
    got, _ = packed_unroll(model, batch, lm_head, 3, 0.5, loss_norm=norm)
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-5)


def test_packed_unroll_without_counted_positions_falls_back():
    model = _model(layers=1)
    batch, lm_head = _batch()
    batch["loss_mask"] = torch.zeros_like(batch["loss_mask"])
    loss, stats = packed_unroll(model, batch, lm_head, 3, 0.8)
    assert float(loss.detach()) == 0.0 and float(stats.sum()) == 0.0 and loss.requires_grad


def test_packed_unroll_takes_the_padded_path_when_too_much_counts():
    """max_kept: above that share of counted positions the result is the padded unroll's, bit for bit."""
    model = _model(layers=1)
    batch, lm_head = _batch()
    tg = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d, top=batch["target_top"])
    want, want_stats = ttt_unroll(model, batch, tg, 3, 0.8)
    calls = []

    def core(*args):  # packed_core, counted: which path ran
        calls.append(1)
        return packed_core(*args)

    got, got_stats = packed_unroll(model, batch, lm_head, 3, 0.8, max_kept=0.1, core=core)  # about half count
    assert torch.equal(got.detach(), want.detach()) and torch.equal(got_stats, want_stats) and not calls
    packed, _ = packed_unroll(model, batch, lm_head, 3, 0.8, max_kept=0.9, core=core)
    assert calls == [1] and float(packed.detach()) == pytest.approx(float(want.detach()), rel=1e-5)


@pytest.fixture
def on_meta(monkeypatch):
    """Moves a model, batch and head to the meta device: shapes without data, so any step that must read a value
    back to the host (nonzero, item, tolist, a boolean index; each a host sync on a GPU) raises. Autocast has no
    meta device: the draft asks whether it is on, and here it is not."""
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda *args: False)
    meta = torch.device("meta")
    return lambda model, batch, lm_head: (model.to(meta), {k: v.to(meta) for k, v in batch.items()}, lm_head.to(meta))


def test_packed_unroll_with_a_host_plan_reads_nothing_back(on_meta):
    """With the plan listed on the host (what the trainer does), forward and backward never wait on the device."""
    model, (batch, lm_head) = _model(layers=2), _batch()
    plan = PackedPlan.of(batch["loss_mask"], batch["attention_mask"], 3)
    model, batch, lm_head = on_meta(model, batch, lm_head)
    loss, stats = packed_unroll(model, batch, lm_head, 3, 0.8, plan=plan)
    loss.backward()
    assert stats.shape == (len(STATS), 3) and model.fc.weight.grad.device.type == "meta"


def test_packed_unroll_without_a_plan_lists_rows_on_the_device(on_meta):
    """The meta test above can fail: without a host plan the rows are listed on the device, which reads back."""
    model, batch, lm_head = on_meta(_model(layers=1), *_batch())
    with pytest.raises(NotImplementedError, match="nonzero"):
        packed_unroll(model, batch, lm_head, 3, 0.8)


def test_a_plan_sent_to_a_device_keeps_every_field():
    """`to` sends the plan's four index lists as one tensor and splits it again: each comes back as itself."""
    batch, _ = _batch(seed=5)
    plan = PackedPlan.of(batch["loss_mask"], batch["attention_mask"], 3)
    sent = plan.to(torch.device("cpu"))
    assert len({len(plan.kept), len(plan.needed), len(plan.step_of)}) == 3  # a swap of fields would show
    for field in ("kept", "needed", "step_of", "row_of", "real"):
        assert torch.equal(getattr(sent, field), getattr(plan, field)), field
    assert sent.shape == plan.shape and sent.sizes == plan.sizes and sent.counted == plan.counted
    padded = plan.padded(16)
    sent = padded.to(torch.device("cpu"))
    assert not padded.real.all() and torch.equal(sent.real, padded.real) and sent.real.dtype == torch.bool


@pytest.mark.parametrize("layers", [1, 2])
def test_a_batch_padded_to_buckets_trains_as_the_batch_itself(layers):
    """train.compile_cuda_graphs pads rows, length and every count of the plan (`PackedPlan.padded`) so that batches
    share sizes: the filler rows and pairs change no loss, gradient or stat."""
    from draftlab.train.device_batch import attach_plan, to_device

    model = _model(layers=layers)
    batch, lm_head = _batch(seed=7)
    steps = 3
    plain, plain_plan = to_device(attach_plan(batch, steps), torch.device("cpu"), steps)
    padded, padded_plan = to_device(attach_plan(batch, steps, 8, rows=8, counts=20), torch.device("cpu"), steps)
    # the padding happened: more rows and positions, filler kept and teacher rows, filler pairs in every step
    assert padded_plan.shape == (8, 16) and padded["features"].shape[:2] == (8, 16)
    capacity = len(padded_plan.kept)
    assert capacity == len(padded_plan.needed) == 40 > plain_plan.counted == padded_plan.counted
    assert padded_plan.sizes == [capacity] * steps and int(padded_plan.real.sum()) == sum(plain_plan.sizes)
    loss_a, stats_a, grads_a = _run(lambda: packed_unroll(model, plain, lm_head, steps, 0.8, plan=plain_plan), model)
    loss_b, stats_b, grads_b = _run(lambda: packed_unroll(model, padded, lm_head, steps, 0.8, plan=padded_plan),
                                    model)
    assert float(loss_b) == pytest.approx(float(loss_a), rel=1e-5)
    counts = [STATS.index(k) for k in ("n_loss", "correct", "n", "chain", "valid", "chain_prev", "oov")]
    assert torch.equal(stats_b[counts], stats_a[counts]) and stats_a[STATS.index("oov"), 0] > 0
    assert torch.allclose(stats_b, stats_a, rtol=1e-5, atol=1e-4)
    assert grads_a.keys() == grads_b.keys()
    for name, grad in grads_a.items():
        assert torch.allclose(grads_b[name], grad, rtol=1e-4, atol=1e-6), name


def test_a_padded_plan_of_a_batch_too_small_for_its_capacity_stops_at_its_positions():
    batch, _ = _batch()
    plan = PackedPlan.of(batch["loss_mask"], batch["attention_mask"], 3).padded(1024)
    assert len(plan.kept) == len(plan.needed) == 4 * T and len(set(plan.kept.tolist())) == 4 * T


def test_a_plan_from_another_batch_is_refused():
    model, (batch, lm_head) = _model(layers=1), _batch()
    plan = PackedPlan.of(batch["loss_mask"][:, :-1], batch["attention_mask"][:, :-1], 3)
    with pytest.raises(ValueError, match="plan is for a"):
        packed_unroll(model, batch, lm_head, 3, 0.8, plan=plan)


@pytest.mark.parametrize("with_top", [True, False])
def test_teacher_rows_hold_bf16_logits_and_give_the_softmax_of_them(with_top):
    """The packed unroll keeps the teacher as logits in lm_head's dtype (half the bytes of fp32 probabilities in a
    bf16 run) and forms each step's soft targets from them: the same fp32 softmax `target_distribution` gives."""
    from draftlab.train.packed import Rows, RowTargets

    model = _model(layers=1)
    batch, lm_head = _batch(seed=9, with_top=with_top)
    head = lm_head.to(torch.bfloat16)
    plan = PackedPlan.of(batch["loss_mask"], batch["attention_mask"], 3)
    rows = Rows(plan.needed, (4, T))
    teacher = RowTargets(batch["last_hidden"], head, model.d2t, model.t2d, rows, top=batch.get("target_top"))
    want = target_distribution(batch["last_hidden"], head, model.d2t, model.t2d, top=batch.get("target_top"))
    assert teacher.logits.dtype == torch.bfloat16 and teacher.lse.dtype == torch.float32
    picked = torch.tensor([len(rows) - 1, 0, 2])  # any rows, in any order
    b, t = rows.b[picked], rows.t[picked]
    assert torch.allclose(teacher.probs_at(picked), want.probs[b, t], rtol=1e-5, atol=1e-7)
    # and what both form is the softmax, written here as torch's own rather than as their shared formula
    assert torch.allclose(teacher.probs_at(picked), teacher.logits[picked].float().softmax(-1), rtol=1e-5, atol=1e-7)
    assert torch.equal(teacher.top[b, t], want.top[b, t]) and torch.equal(teacher.in_vocab[b, t], want.in_vocab[b, t])

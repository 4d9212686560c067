"""The training loop and the train stage on a synthetic target (CPU, seconds).

The synthetic target's next token is the *previous* input token: at position s it predicts x_{s-1}. The draft
sees x_{s-1} only through the target features (f_t holds an embedding of x_t), and at later TTT steps only
through its own hidden state, so accuracy above chance means features and the hidden recurrence both work.
"""

from __future__ import annotations

import types

import pytest
import torch
from safetensors.torch import load_file

from draftlab.config.config import default_config
from draftlab.model.draft import DraftModelConfig, Eagle3Draft
from draftlab.util.reporting import RecordingReporter
from draftlab.train.loop import LoopSettings, Trainer, lr_factor
from draftlab.train.optim import build_optimizer

V, VD, HT, LAYERS = 48, 40, 32, [1, 3, 5]  # target vocab, draft vocab (ids 0..39), target hidden, aux layers


class FakeSource:
    """The FeatureSource interface (manifest, batches, head, vocab) over synthetic data."""

    def __init__(self, n_train: int = 48, n_val: int = 16, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(V, HT, generator=g)
        self.lm_head = torch.nn.functional.normalize(torch.randn(V, HT, generator=g), dim=-1)
        self.feat = [torch.randn(V, HT, generator=g) for _ in LAYERS]
        self.samples = {"train": [self._sample(g) for _ in range(n_train)],
                        "val": [self._sample(g) for _ in range(n_val)]}
        self.manifest = {"layer_ids": LAYERS, "target": {"hidden_size": HT, "config": {
            "hidden_size": HT, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
            "vocab_size": V, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256}}}

    def _sample(self, g) -> dict:
        T = int(torch.randint(12, 25, (), generator=g))
        x = torch.randint(0, VD, (T,), generator=g)
        oov = torch.rand(T, generator=g) < 0.1
        x[oov] = torch.randint(VD, V, (int(oov.sum()),), generator=g)
        prev = torch.cat([x[:1], x[:-1]])
        feats = torch.cat([self.feat[0][x], self.feat[1][x], 0.1 * torch.randn(T, HT, generator=g)], -1)
        loss_mask = torch.ones(T, dtype=torch.bool)
        loss_mask[:2] = False  # a two-token "prompt"
        return {"input_ids": x, "features": feats.to(torch.bfloat16),
                "last_hidden": (8.0 * self.lm_head[prev]).to(torch.bfloat16), "loss_mask": loss_mask}

    def batches(self, split, epoch, batch_tokens, max_seq_len, seed, shuffle, prepare=None):
        for batch in self._batches(split, epoch, batch_tokens, max_seq_len, seed, shuffle):
            yield prepare(batch) if prepare else batch

    def _batches(self, split, epoch, batch_tokens, max_seq_len, seed, shuffle):
        items = self.samples[split]
        order = list(range(len(items)))
        if shuffle:
            order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed * 1000 + epoch)).tolist()
        chunk: list[dict] = []
        for i in order:
            longest = max([len(c["input_ids"]) for c in chunk] + [len(items[i]["input_ids"])])
            if chunk and longest * (len(chunk) + 1) > batch_tokens:
                yield _collate(chunk)
                chunk = []
            chunk.append(items[i])
        if chunk:
            yield _collate(chunk)

    def head(self) -> dict:
        return {"embed_tokens.weight": self.emb.clone(), "lm_head.weight": self.lm_head.clone()}

    def num_tokens(self, split) -> int:
        return sum(len(s["input_ids"]) for s in self.samples[split])

    def num_samples_in(self, split) -> int:
        return len(self.samples[split])

    def vocab(self):
        return torch.zeros(VD, dtype=torch.long), torch.arange(V) < VD


def _collate(items: list[dict]) -> dict:
    T = max(len(i["input_ids"]) for i in items)

    def pad(key, value=0):
        rows = []
        for i in items:
            t = i[key]
            extra = torch.full((T - len(t),) + t.shape[1:], value, dtype=t.dtype)
            rows.append(torch.cat([t, extra]))
        return torch.stack(rows)

    mask = torch.stack([torch.arange(T) < len(i["input_ids"]) for i in items])
    return {"input_ids": pad("input_ids"), "features": pad("features"), "last_hidden": pad("last_hidden"),
            "loss_mask": pad("loss_mask", False), "attention_mask": mask}


def _model(source: FakeSource, seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    cfg = DraftModelConfig(hidden_size=HT, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=8, target_hidden_size=HT, aux_layer_ids=LAYERS, vocab_size=V,
                           draft_vocab_size=VD)
    model = Eagle3Draft(cfg)
    head = source.head()
    model.init_from_target(head["embed_tokens.weight"], head["lm_head.weight"], *source.vocab())
    return model


def _settings(**kw) -> LoopSettings:
    base = dict(epochs=2, max_steps=None, early_stop_patience=None, lr=3e-3, schedule="cosine", warmup_ratio=0.1,
                ttt_steps=3, loss_decay=0.8,
                batch_tokens=200, max_seq_len=64, grad_clip=0.5, seed=0, log_every=4, checkpoint_every=5,
                num_steps=3, device="cpu", dtype="float32")
    base.update(kw)
    return LoopSettings(**base)


def test_lr_schedules():
    assert lr_factor(0, 100, 0.1, "cosine") == pytest.approx(0.1)
    assert lr_factor(9, 100, 0.1, "cosine") == pytest.approx(1.0)
    assert lr_factor(10, 100, 0.1, "cosine") == pytest.approx(1.0)
    assert lr_factor(55, 100, 0.1, "cosine") == pytest.approx(0.5)
    assert lr_factor(55, 100, 0.1, "linear") == pytest.approx(0.5)
    assert lr_factor(99, 100, 0.1, "linear") == pytest.approx(1 / 90)
    assert lr_factor(99, 100, 0.0, "constant") == 1.0
    # wsd: stable until total / (1 + decay_ratio), then linear to zero at the end
    assert lr_factor(50, 120, 0.0, "wsd", decay_ratio=0.2) == 1.0
    assert lr_factor(100, 120, 0.0, "wsd", decay_ratio=0.2) == pytest.approx(1.0)
    assert lr_factor(110, 120, 0.0, "wsd", decay_ratio=0.2) == pytest.approx(0.5)
    # a plateau at step 40 moved the decay: 40 -> 48, whatever the budget
    assert lr_factor(39, 120, 0.0, "wsd", decay_start=40, end=48) == 1.0
    assert lr_factor(44, 120, 0.0, "wsd", decay_start=40, end=48) == pytest.approx(0.5)
    assert lr_factor(47, 120, 0.0, "wsd", decay_start=40, end=48) == pytest.approx(1 / 8)


def test_val_accuracy_climbs_far_above_chance(tmp_path):
    source = FakeSource()
    rep = RecordingReporter()
    trainer = Trainer(_model(source), source, source.lm_head, _settings(epochs=25, lr=1e-2, checkpoint_every=10_000),
                      tmp_path / "ckpt", rep)
    before = trainer.evaluate("val")
    result = trainer.run()
    last = result.history[-1]
    chance = 1 / VD
    assert result.steps >= 150
    assert before["acc_0"] < 0.2 and last["val/acc_0"] > 0.6 > 10 * chance, last
    # later steps can only learn through the draft's own hidden state (x_{t+j} entered as a token at step j-1)
    assert last["val/acc_1"] > 0.25 and last["val/acc_2"] > 0.15, last
    assert last["val/loss"] < 0.6 * before["loss"]
    assert 0.05 < last["val/out_of_vocab_frac"] < 0.2  # the ~10% targets outside the draft vocab are counted
    for name in ("train/loss", "val/loss", "lr", "val/acc_0", "val/full_acc_2", "val/cond_acc_1",
                 "val/predicted_tau", "train/tokens_per_s", "best/epoch", "best/val_loss", "best/predicted_tau"):
        assert rep.series(name), name
    tau = 1 + sum(last[f"val/full_acc_{j}"] for j in range(3))
    assert last["val/predicted_tau"] == pytest.approx(tau)


def test_cpu_trainer_uses_the_packed_unroll_and_trains_as_the_padded_one(tmp_path):
    """On the CPU the loop trains through train/packed.py; the weights and metrics equal the padded unroll's."""
    runs = {}
    for packed in (True, False):
        source = FakeSource(n_train=16, n_val=8)
        trainer = Trainer(_model(source), source, source.lm_head, _settings(epochs=2, batch_tokens=100),
                          tmp_path / str(packed), RecordingReporter())
        assert trainer.packed  # the CPU default
        trainer.packed = packed
        runs[packed] = trainer.run(), trainer.model.state_dict()
    (fast, w_fast), (plain, w_plain) = runs[True], runs[False]
    assert fast.steps == plain.steps > 4
    for key, value in _comparable(plain.final).items():
        assert fast.final[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for name, tensor in w_plain.items():
        assert torch.allclose(w_fast[name], tensor, rtol=1e-4, atol=1e-6), name


def test_fused_cpu_adamw_updates_as_the_foreach_one():
    """build_optimizer fuses AdamW on the CPU; the weights follow the unfused (foreach) AdamW's."""
    source = FakeSource(n_train=4, n_val=1)
    fused_model, plain_model = _model(source), _model(source)
    fused = build_optimizer(fused_model, 1e-2, 0.1, torch.device("cpu"))
    assert all(group["fused"] for group in fused.param_groups)
    plain = build_optimizer(plain_model, 1e-2, 0.1, torch.device("cpu"))
    for group in plain.param_groups:
        group.update(fused=False, foreach=True)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        for a, b in zip(fused_model.parameters(), plain_model.parameters()):
            if a.requires_grad:
                a.grad = torch.randn(a.shape, generator=g)
                b.grad = a.grad.clone()
        fused.step()
        plain.step()
    moved = 0.0
    starts = _model(source).parameters()
    for (name, a), b, start in zip(fused_model.named_parameters(), plain_model.parameters(), starts):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), name
        moved = max(moved, float((a - start).detach().abs().max()))
    assert moved > 0.01  # the steps did update the weights


class _Kill(Exception):
    pass


def _run(folder, kill_at=None, **kw):
    source = FakeSource(n_train=24, n_val=8)
    kw.setdefault("batch_tokens", 100)  # ~6 batches per epoch

    def on_step(step):
        if step == kill_at:
            raise _Kill

    trainer = Trainer(_model(source), source, source.lm_head, _settings(**kw), folder, RecordingReporter(), on_step)
    return trainer.run(), trainer


def _comparable(metrics: dict) -> dict:
    """What a resumed run must reproduce: not its speed, nor how many steps its own process took."""
    timing = ("tokens_per_s", "data_wait_frac")
    return {k: v for k, v in metrics.items() if not any(t in k for t in timing) and k != "train/new_steps"}


def test_kill_and_resume_matches_uninterrupted_run(tmp_path):
    ref, ref_trainer = _run(tmp_path / "ref", epochs=3)
    assert ref.steps > 12
    assert ref.final["train/new_steps"] == ref.steps
    with pytest.raises(_Kill):
        _run(tmp_path / "killed", kill_at=11, epochs=3)  # mid-epoch 1; last checkpoint at step 10
    again, trainer = _run(tmp_path / "killed", epochs=3)
    assert again.steps == ref.steps
    assert again.final["train/new_steps"] == ref.steps - 10  # what this process trained: it prices the job
    assert _comparable(again.final) == _comparable(ref.final)
    assert again.best == ref.best
    assert again.history == ref.history
    for k, v in ref_trainer.model.state_dict().items():
        assert torch.equal(v, trainer.model.state_dict()[k]), k
    a, b = load_file(str(ref.best_weights)), load_file(str(again.best_weights))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # a resumed run that finds a finished folder trains no more
    done, _ = _run(tmp_path / "killed", epochs=3)
    assert done.steps == ref.steps
    assert done.final["train/new_steps"] == 0


def test_resume_sensitivity(tmp_path):
    """The resume test can fail: losing the optimizer state changes the result."""
    ref, ref_trainer = _run(tmp_path / "ref", epochs=2)
    with pytest.raises(_Kill):
        _run(tmp_path / "k", kill_at=7, epochs=2)
    for opt in (tmp_path / "k").glob("ckpt-*/optimizer.safetensors"):
        from safetensors.torch import save_file

        save_file({k: torch.zeros_like(v) for k, v in load_file(str(opt)).items()}, str(opt))
    again, trainer = _run(tmp_path / "k", epochs=2)
    assert any(not torch.equal(v, trainer.model.state_dict()[k]) for k, v in ref_trainer.model.state_dict().items())


def test_init_from_continues_for_more_epochs(tmp_path):
    short, _ = _run(tmp_path / "short", epochs=1)
    longer, _ = _run(tmp_path / "longer", epochs=2)
    cont_source = FakeSource(n_train=24, n_val=8)
    trainer = Trainer(_model(cont_source, seed=123), cont_source, cont_source.lm_head,
                      _settings(epochs=2, batch_tokens=100), tmp_path / "cont", RecordingReporter())
    cont = trainer.run(init_from=tmp_path / "short")
    assert cont.steps == longer.steps  # same number of batches: continued, not restarted
    assert len(cont.history) == 2 and cont.history[0] == short.history[0]
    assert cont.best_weights.exists() and not list((tmp_path / "cont").glob(".*.tmp"))  # no copy left half-done


def _install_fake_source(monkeypatch, source):
    import draftlab.data.reader as reader

    monkeypatch.setattr(reader, "open_source", lambda cfg, inputs: source)


def test_stage_run_exports_best_draft(tmp_path, monkeypatch):
    from draftlab.sglang.export import load_draft
    from draftlab.stages import train as stage

    source = FakeSource(n_train=16, n_val=8)
    _install_fake_source(monkeypatch, source)
    cfg = default_config({"draft": {"vocab_size": VD}, "serve": {"num_steps": 2},
                          "train": {"epochs": 2, "max_steps": None, "ttt_steps": 2, "batch_tokens": 200,
                                    "max_seq_len": 64, "log_every": 2, "checkpoint_every": 4, "device": "cpu",
                                    "bench_every": None}})  # no target here: test_bench_during_training's
    rep = RecordingReporter()
    out = tmp_path / "train"
    clock = iter([10.0, 14.0])  # the stage reads the clock before and after its loop: 4 s
    monkeypatch.setattr(stage, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    metrics = stage.run(cfg, out, {"extract": tmp_path / "extract"}, rep)
    assert rep.tags["draft_dir"] == str(out / "draft")
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG" and (out / "curves.png", None) in rep.artifacts
    assert (out / "manifest.json").exists()
    for key in ("val/loss", "val/predicted_tau", "best/epoch", "best/val_loss", "train/loss"):
        assert key in metrics, key
    assert metrics["val/predicted_tau"] == pytest.approx(1 + metrics["val/full_acc_0"] + metrics["val/full_acc_1"])
    # the loop's mean rate: every token of the two epochs trained, over the loop's 4 s
    assert metrics["train/epochs_seen"] == 2
    assert metrics["train/mean_tokens_per_s"] == pytest.approx(2 * source.num_tokens("train") / 4.0)
    draft = load_draft(out / "draft")
    assert draft.cfg.aux_layer_ids == LAYERS and draft.cfg.max_position_embeddings >= 256
    best = load_file(str(next((out / "checkpoints").glob("best-epoch*.safetensors"))))
    assert torch.allclose(draft.state_dict()["fc.weight"], best["fc.weight"].to(torch.bfloat16).float())


def test_max_steps_replaces_epochs_and_eval_every_sets_validation(tmp_path):
    result, trainer = _run(tmp_path / "r", epochs=1, max_steps=15, eval_every=4, schedule="wsd")
    per_epoch = trainer.state["epoch_batches"]
    assert per_epoch < 15  # the budget runs past one epoch: epochs no longer limits
    assert result.steps == 15 and trainer.state["total_steps"] == 15
    assert [h["step"] for h in result.history] == [4.0, 8.0, 12.0, 15.0]  # every 4 steps, and at the end
    assert result.final["train/epochs_seen"] == pytest.approx(15 / per_epoch)
    assert result.final["train/stopped_early"] == 0.0 and result.final["train/steps"] == 15.0
    best = min(result.history, key=lambda h: h["val/loss"])
    assert result.best["best/step"] == best["step"] and result.best["best/val_loss"] == best["val/loss"]
    assert result.best_weights.name.endswith(f"step{int(best['step']):09d}.safetensors")
    assert len(list((tmp_path / "r").glob("best-epoch*.safetensors"))) == 1


def test_early_stopping_starts_the_wsd_decay_then_stops(tmp_path):
    # the delta test, min_delta 0.9: no pass after the first is a material improvement: the plateau at the 3rd pass
    rep = RecordingReporter()
    source = FakeSource(n_train=24, n_val=8)
    s = _settings(max_steps=100, eval_every=3, early_stop_patience=2, early_stop_min_delta=0.9, schedule="wsd",
                  plateau_test="delta",
                  decay_ratio=0.5, warmup_ratio=0.0, batch_tokens=100, log_every=1)
    trainer = Trainer(_model(source), source, source.lm_head, s, tmp_path / "c", rep)
    result = trainer.run()
    assert trainer.state["decay_start"] == 9 and result.steps == 9 + round(0.5 * 9)
    assert result.final["train/stopped_early"] == 1.0
    lrs = rep.series("lr")
    assert lrs[8] == pytest.approx(s.lr) and lrs[-1] < 0.5 * s.lr  # stable, then decayed
    # other schedules stop at the plateau itself
    cosine, _ = _run(tmp_path / "cos", max_steps=100, eval_every=3, early_stop_patience=2, early_stop_min_delta=0.9,
                     plateau_test="delta")
    assert cosine.steps == 9 and cosine.final["train/stopped_early"] == 1.0
    # without early stopping the same run uses its whole budget
    full, _ = _run(tmp_path / "full", max_steps=20, eval_every=3, schedule="wsd")
    assert full.steps == 20 and full.final["train/stopped_early"] == 0.0


def test_the_steps_probe_trains_on_past_the_plateau_then_decays(tmp_path):
    """train.extend_steps: the plateau (step 9) is followed by 6 constant-lr steps, then the usual decay."""
    kw = dict(max_steps=20, eval_every=3, early_stop_patience=2, early_stop_min_delta=0.9, schedule="wsd",
              plateau_test="delta", decay_ratio=0.5, warmup_ratio=0.0)
    probe, trainer = _run(tmp_path / "probe", extend_steps=6, **kw)
    assert trainer.state["decay_start"] == 15 and probe.steps == 15 + round(0.5 * 15)  # past the 20-step cap
    assert probe.final["train/plateau_step"] == 9.0 and probe.final["train/stopped_early"] == 1.0
    assert {"train/final_slope", "train/final_slope_lo", "train/final_slope_hi"} <= set(probe.final)
    plain, _ = _run(tmp_path / "plain", **kw)
    assert plain.steps == 9 + round(0.5 * 9) and plain.history[:3] == probe.history[:3]  # the same run to the plateau


@pytest.mark.parametrize("kill_at", [7, 11])  # before the plateau (step 9), and inside the decay it started
def test_kill_and_resume_is_exact_with_step_budget_and_early_stopping(tmp_path, kill_at):
    kw = dict(max_steps=40, eval_every=3, early_stop_patience=2, early_stop_min_delta=0.9, schedule="wsd",
              plateau_test="delta",
              decay_ratio=0.5, checkpoint_every=5)
    ref, ref_trainer = _run(tmp_path / "ref", **kw)
    assert ref.final["train/stopped_early"] == 1.0 and ref.steps < 40
    with pytest.raises(_Kill):
        _run(tmp_path / "killed", kill_at=kill_at, **kw)
    again, trainer = _run(tmp_path / "killed", **kw)
    assert again.steps == ref.steps and again.history == ref.history and again.best == ref.best
    assert _comparable(again.final) == _comparable(ref.final)
    for k, v in ref_trainer.model.state_dict().items():
        assert torch.equal(v, trainer.model.state_dict()[k]), k
    a, b = load_file(str(ref.best_weights)), load_file(str(again.best_weights))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_config_checks_the_new_train_keys():
    from draftlab.config.config import ConfigError

    for bad, key in (({"max_steps": 0}, "train.max_steps"), ({"eval_every": -1}, "train.eval_every"),
                     ({"early_stop_patience": 0}, "train.early_stop_patience"),
                     ({"early_stop_min_delta": 1.5}, "train.early_stop_min_delta"),
                     ({"decay_ratio": 0.0}, "train.decay_ratio"), ({"schedule": "step"}, "train.schedule")):
        with pytest.raises(ConfigError, match=key):
            default_config({"train": bad})
    assert default_config({"train": {"max_steps": 10, "schedule": "wsd"}}).train.max_steps == 10


def test_resume_from_a_checkpoint_written_before_the_step_budget(tmp_path):
    """A checkpoint without the budget keys (an older draftlab) still resumes to the same end."""
    import json

    ref, _ = _run(tmp_path / "ref", epochs=3)
    with pytest.raises(_Kill):
        _run(tmp_path / "old", kill_at=11, epochs=3)
    for state_file in (tmp_path / "old").glob("ckpt-*/trainer.json"):
        state = json.loads(state_file.read_text())
        for key in ("epoch_batches", "stop_at", "decay_start", "plateau", "stopped_early", "last_eval_step"):
            state.pop(key)
        state_file.write_text(json.dumps(state))
    again, _ = _run(tmp_path / "old", epochs=3)
    assert again.steps == ref.steps and again.history == ref.history and again.best == ref.best


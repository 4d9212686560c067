"""The training loop and the train stage on a synthetic target (CPU, seconds).

The synthetic target's next token is the *previous* input token: at position s it predicts x_{s-1}. The draft
sees x_{s-1} only through the target features (f_t holds an embedding of x_t), and at later TTT steps only
through its own hidden state, so accuracy above chance means features and the hidden recurrence both work.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from safetensors.torch import load_file

from draftlab.config import default_config
from draftlab.model.draft import DraftModelConfig, Eagle3Draft
from draftlab.reporting import RecordingReporter
from draftlab.train.loop import LoopSettings, Trainer, lr_factor



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

    def batches(self, split, epoch, batch_tokens, max_seq_len, seed, shuffle):
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
    base = dict(epochs=2, lr=3e-3, schedule="cosine", warmup_ratio=0.1, ttt_steps=3, loss_decay=0.8,
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


def test_val_accuracy_climbs_far_above_chance(tmp_path):
    source = FakeSource()
    rep = RecordingReporter()
    trainer = Trainer(_model(source), source, source.lm_head, _settings(epochs=25, lr=1e-2, checkpoint_every=10_000),
                      tmp_path / "ckpt", rep)
    before = trainer.evaluate("val")
    result = trainer.run()
    first, last = result.history[0], result.history[-1]
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
    return {k: v for k, v in metrics.items() if "tokens_per_s" not in k}


def test_kill_and_resume_matches_uninterrupted_run(tmp_path):
    ref, ref_trainer = _run(tmp_path / "ref", epochs=3)
    assert ref.steps > 12
    with pytest.raises(_Kill):
        _run(tmp_path / "killed", kill_at=11, epochs=3)  # mid-epoch 1; last checkpoint at step 10
    again, trainer = _run(tmp_path / "killed", epochs=3)
    assert again.steps == ref.steps
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
    trainer = Trainer(_model(cont_source, seed=123), cont_source, cont_source.lm_head, _settings(epochs=2, batch_tokens=100),
                      tmp_path / "cont", RecordingReporter())
    cont = trainer.run(init_from=tmp_path / "short")
    assert cont.steps == longer.steps  # same number of batches: continued, not restarted
    assert len(cont.history) == 2 and cont.history[0] == short.history[0]


def _install_fake_features(monkeypatch, source):
    try:
        import draftlab.data.features as features
    except ImportError:
        features = types.ModuleType("draftlab.data.features")
        monkeypatch.setitem(sys.modules, "draftlab.data.features", features)
    monkeypatch.setattr(features, "open_source", lambda cfg, inputs: source, raising=False)


def test_stage_run_exports_best_draft(tmp_path, monkeypatch):
    from draftlab.export import load_draft
    from draftlab.stages import train as stage

    source = FakeSource(n_train=16, n_val=8)
    _install_fake_features(monkeypatch, source)
    cfg = default_config({"draft": {"vocab_size": VD}, "serve": {"num_steps": 2},
                          "train": {"epochs": 2, "ttt_steps": 2, "batch_tokens": 200, "max_seq_len": 64,
                                    "log_every": 2, "checkpoint_every": 4, "device": "cpu"}})
    rep = RecordingReporter()
    out = tmp_path / "train"
    metrics = stage.run(cfg, out, {"extract": tmp_path / "extract"}, rep)
    assert rep.tags["draft_dir"] == str(out / "draft")
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG" and (out / "curves.png", None) in rep.artifacts
    assert (out / "manifest.json").exists()
    for key in ("val/loss", "val/predicted_tau", "best/epoch", "best/val_loss", "train/loss"):
        assert key in metrics, key
    assert metrics["val/predicted_tau"] == pytest.approx(1 + metrics["val/full_acc_0"] + metrics["val/full_acc_1"])
    draft = load_draft(out / "draft")
    assert draft.cfg.aux_layer_ids == LAYERS and draft.cfg.max_position_embeddings >= 256
    best = load_file(str(next((out / "checkpoints").glob("best-epoch*.safetensors"))))
    assert torch.allclose(draft.state_dict()["fc.weight"], best["fc.weight"].to(torch.bfloat16).float())

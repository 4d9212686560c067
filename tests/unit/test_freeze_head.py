"""train.freeze_lm_head: the draft head stays at the target head's draft-vocab rows through training, the best
weights and export (speculators trains so); the plan counts it as not trained; a draft whose width differs from
the target's, which has no such rows, is refused naming the key (FSDP: tests/integration/test_distributed.py)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from draftlab.config.config import default_config
from draftlab.model.draft import DraftModelConfig, Eagle3Draft
from draftlab.plan.plan_estimates import draft_params
from draftlab.util.reporting import RecordingReporter
from test_train_loop import HT, LAYERS, V, VD, FakeSource, _install_fake_source


def _cfg(freeze: bool):
    return default_config({"draft": {"vocab_size": VD}, "serve": {"num_steps": 2},
                           "train": {"epochs": 2, "max_steps": None, "ttt_steps": 2, "batch_tokens": 200,
                                     "max_seq_len": 64, "lr": 1e-2, "log_every": 2, "checkpoint_every": 4,
                                     "device": "cpu", "freeze_lm_head": freeze}})


@pytest.mark.parametrize("freeze", [True, False])
def test_a_frozen_head_is_exported_at_the_target_rows(tmp_path, monkeypatch, freeze):
    from draftlab.sglang.export import load_draft
    from draftlab.stages import train as stage

    source = FakeSource(n_train=16, n_val=8)
    _install_fake_source(monkeypatch, source)
    out = tmp_path / "train"
    stage.run(_cfg(freeze), out, {"extract": tmp_path / "extract"}, RecordingReporter())
    draft = load_draft(out / "draft")
    rows = source.lm_head[:VD].to(torch.bfloat16).float()  # the fake vocab maps draft id i to target id i
    assert torch.equal(draft.lm_head.weight, rows) is freeze  # trained, the head moves
    best = load_file(str(next((out / "checkpoints").glob("best-epoch*.safetensors"))))
    assert ("lm_head.weight" in best) is not freeze  # frozen, it is the target's: re-copied on load, as the embedding
    torch.manual_seed(0)  # train.seed: the stage's draft before training (stages/train.py build_model)
    start = Eagle3Draft(draft.cfg)
    start.init_from_target(source.emb, source.lm_head, *source.vocab(), freeze_head=freeze)
    assert not torch.allclose(draft.fc.weight, start.fc.weight.to(torch.bfloat16).float())  # the rest trained


def test_a_frozen_head_needs_the_target_width():
    source = FakeSource()
    cfg = DraftModelConfig(hidden_size=2 * HT, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, target_hidden_size=HT, aux_layer_ids=LAYERS, vocab_size=V,
                           draft_vocab_size=VD)
    model = Eagle3Draft(cfg)
    model.init_from_target(source.emb, source.lm_head, *source.vocab())  # trained head: any width
    assert model.lm_head.weight.requires_grad
    with pytest.raises(ValueError, match=r"^train\.freeze_lm_head: .*draft\.hidden_size"):
        model.init_from_target(source.emb, source.lm_head, *source.vocab(), freeze_head=True)


def test_the_plan_counts_a_frozen_head_as_not_trained():
    shape = {"hidden_size": 64, "target_hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "aux_layer_ids": LAYERS, "vocab_size": 100,
             "draft_vocab_size": 50, "num_hidden_layers": 1}
    trained, frozen = draft_params(shape), draft_params(shape, freeze_head=True)
    assert frozen.total == trained.total and trained.trained - frozen.trained == 64 * 50
    assert frozen.head_frozen and not trained.head_frozen

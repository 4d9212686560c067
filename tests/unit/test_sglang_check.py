"""check-draft passes a good export and fails each faulty one, naming the offending key."""

import json

import pytest
import torch

from draftlab.sglang.check import check_draft, check_draft_main
from sglang_fixtures import write_draft, write_extract_manifest, write_target


@pytest.fixture
def target(tmp_path):
    return write_target(tmp_path / "target")


def errors_at(report):
    return {f.where for f in report.errors}


def test_good_export_passes(tmp_path, target):
    manifest = write_extract_manifest(tmp_path / "manifest.json", [1, 3, 4])
    report = check_draft(write_draft(tmp_path / "d"), target, "current", manifest)
    assert report.ok, report.summary()
    assert report.keys.has_d2t


def test_layers0_names_fail_under_legacy_rules(tmp_path, target):
    report = check_draft(write_draft(tmp_path / "d"), target, rules="legacy")
    where = errors_at(report)
    assert "layers.0.self_attn.q_proj.weight" in where
    assert "layers.0.mlp.down_proj.weight" in where
    assert "model.midlayer.self_attn.qkv_proj.weight" in where
    assert "fc.weight" not in where
    assert "dropped silently" in report.summary()


def test_foreign_prefix_is_dropped(tmp_path, target):
    folder = write_draft(tmp_path / "d", rename=lambda k: "draft_model." + k if k == "fc.weight" else k)
    where = errors_at(check_draft(folder, target))
    assert {"draft_model.fc.weight", "model.fc.weight"} <= where


def test_tied_embeddings_fail(tmp_path, target):
    report = check_draft(write_draft(tmp_path / "d", config_patch={"tie_word_embeddings": True}), target)
    assert {"tie_word_embeddings", "lm_head.weight"} <= errors_at(report)


def test_missing_lm_head_fails(tmp_path, target):
    report = check_draft(write_draft(tmp_path / "d", drop=("lm_head.weight",)), target)
    assert "lm_head.weight" in errors_at(report)
    assert "random head" in report.summary()


def test_missing_d2t_fails(tmp_path, target):
    assert "d2t" in errors_at(check_draft(write_draft(tmp_path / "d", drop=("d2t",)), target))


def test_d2t_outside_target_vocab_fails(tmp_path, target):
    folder = write_draft(tmp_path / "d", replace={"d2t": torch.arange(32, dtype=torch.int64) + 40})
    report = check_draft(folder, target)
    assert "d2t" in errors_at(report) and "outside the target vocabulary" in report.summary()


def test_single_layer_fc_fails(tmp_path, target):
    folder = write_draft(tmp_path / "d", replace={"fc.weight": torch.randn(16, 16)})
    report = check_draft(folder, target)
    assert "fc.weight" in errors_at(report)
    assert "1 layer(s) x 16 features" in report.summary()


def test_shifted_layer_ids_fail_against_extract_manifest(tmp_path, target):
    manifest = write_extract_manifest(tmp_path / "manifest.json", [1, 3, 4])
    report = check_draft(write_draft(tmp_path / "d", layer_ids=[2, 4, 5]), target, extract_manifest=manifest)
    assert errors_at(report) == {"eagle_config.eagle_aux_hidden_state_layer_ids"}


def test_uncapturable_last_layer_and_unsorted_ids(tmp_path, target):
    report = check_draft(write_draft(tmp_path / "d", layer_ids=[4, 1, 7]), target)
    assert "eagle_config.eagle_aux_hidden_state_layer_ids" in errors_at(report)
    text = report.summary()
    assert "strictly ascending" in text and "cannot be captured" in text


def test_config_rules(tmp_path, target):
    folder = write_draft(tmp_path / "d", config_patch={
        "-draft_vocab_size": None, "architectures": ["LlamaForCausalLM"], "vocab_size": 65,
        "max_position_embeddings": 1024, "-torch_dtype": None})
    where = errors_at(check_draft(folder, target))
    assert {"draft_vocab_size", "architectures", "vocab_size", "max_position_embeddings", "torch_dtype"} <= where


def test_speculators_folder_is_recognised(tmp_path, target):
    folder = write_draft(tmp_path / "d")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"architectures": ["Eagle3Speculator"],
                                                    "speculators_config": {}, "transformer_layer_config": config}))
    report = check_draft(folder, target)
    assert report.speculators_format and not report.ok
    assert "--to sglang" in report.summary()


def test_cli_exit_codes(tmp_path, target, capsys):
    good = write_draft(tmp_path / "good")
    assert check_draft_main([str(good), "--target", str(target)]) == 0
    assert check_draft_main([str(good), "--target", str(target), "--rules", "legacy"]) == 1
    assert "layers.0.self_attn.q_proj.weight" in capsys.readouterr().err
    assert check_draft_main([str(good), "--target", str(tmp_path / "nowhere")]) == 2  # bad input: refused


def test_the_serving_releases_contract_checks_the_target(tmp_path, target, capsys):
    """Qwen3.5's vision class captures in SGLang 0.5.23; 0.5.17 has no setter that marks its layers."""
    config = json.loads((target / "config.json").read_text()) | {"architectures": ["Qwen3_5ForConditionalGeneration"]}
    (target / "config.json").write_text(json.dumps(config))
    draft = write_draft(tmp_path / "d")
    assert "target" not in errors_at(check_draft(draft, target, sglang_version="0.5.23"))
    old = check_draft(draft, target, sglang_version="0.5.17")
    assert any(f.where == "target" and "Qwen3_5ForConditionalGeneration" in f.message and "SGLang 0.5.17" in f.message
               for f in old.errors)
    assert check_draft_main([str(draft), "--target", str(target), "--sglang-version", "0.5.17",
                             "--no-weight-scan"]) == 1
    assert "_is_layer_to_capture" in capsys.readouterr().err

"""SGLang <-> speculators conversion: bit-exact tensors, layer ids by capture point, refusal of graphs SGLang lacks."""

import json

import pytest
import torch
from safetensors.torch import load_file

from draftlab.sglang.check import check_draft
from draftlab.sglang.cli import main
from draftlab.sglang.formats import FormatError, convert, detect_format
from sglang_fixtures import write_draft, write_target


def test_round_trip_is_bit_exact(tmp_path):
    src = write_draft(tmp_path / "sgl", replace={"fc.weight": torch.randn(16, 48).to(torch.bfloat16)})
    spec = convert(src, tmp_path / "spec", "speculators", verifier="tiny")
    back = convert(spec, tmp_path / "back", "sglang")
    a, b = load_file(src / "model.safetensors"), load_file(back / "model.safetensors")
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key].view(torch.uint8), b[key].view(torch.uint8)), key
    original = json.loads((src / "config.json").read_text())
    again = json.loads((back / "config.json").read_text())
    assert again == original
    assert check_draft(back, write_target(tmp_path / "t")).ok


def test_speculators_config_shape_and_plus_one(tmp_path):
    spec = convert(write_draft(tmp_path / "sgl", layer_ids=[1, 3, 4]), tmp_path / "spec", "speculators")
    config = json.loads((spec / "config.json").read_text())
    assert detect_format(spec) == "speculators"
    assert config["architectures"] == ["Eagle3Speculator"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["transformer_layer_config"]["vocab_size"] == 64
    assert config["speculators_config"]["algorithm"] == "eagle3"
    assert "eagle_config" not in config["transformer_layer_config"]
    assert not check_draft(spec).ok  # SGLang cannot load it; check-draft says so


def test_midlayer_source_gets_speculators_names(tmp_path):
    src = write_draft(tmp_path / "sgl", rename=lambda k: k.replace("layers.0.", "midlayer."))
    spec = convert(src, tmp_path / "spec", "speculators")
    keys = set(load_file(spec / "model.safetensors"))
    assert "layers.0.self_attn.q_proj.weight" in keys and not any("midlayer" in k for k in keys)


def test_norm_before_residual_is_refused(tmp_path):
    spec = convert(write_draft(tmp_path / "sgl"), tmp_path / "spec", "speculators")
    config = json.loads((spec / "config.json").read_text())
    config["norm_before_residual"] = True
    (spec / "config.json").write_text(json.dumps(config))
    with pytest.raises(FormatError, match="norm_before_residual"):
        convert(spec, tmp_path / "back", "sglang")


def test_cli(tmp_path):
    src = write_draft(tmp_path / "sgl")
    assert main(["convert", str(src), str(tmp_path / "spec"), "--to", "speculators"]) == 0
    assert main(["convert", str(tmp_path / "spec"), str(tmp_path / "back"), "--to", "sglang"]) == 0
    assert main(["check-draft", str(tmp_path / "back")]) == 0
    assert main(["nope"]) == 2


def _with_record(folder, layer_ids, capture_points):
    """A sealed training record as export writes it (sglang/draft_provenance.py), for the ids the config names."""
    from draftlab.sglang import draft_provenance

    draft_provenance.write_sealed(folder, {"layer_ids": layer_ids, "capture_points": capture_points,
                                           "feature_width": 48, "target": {"name": "tiny"}})
    return folder


@pytest.mark.parametrize("ids, points", [([1, 3, 4], [2, 4, 5]),    # Llama: id k -> output of layer k
                                         ([2, 3, 4], [2, 3, 4])])   # DeepSeek-V3, first id not 1: as is
def test_speculators_ids_are_the_recorded_capture_points(tmp_path, ids, points):
    """vLLM reads a speculators id as a capture point for every architecture; SGLang's rule depends on the target
    class, so the record's capture points decide, and the way back restores the record's SGLang ids."""
    src = _with_record(write_draft(tmp_path / "sgl", layer_ids=ids), ids, points)
    spec = convert(src, tmp_path / "spec", "speculators")
    assert json.loads((spec / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == points
    back = convert(spec, tmp_path / "back", "sglang")
    assert json.loads((back / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids


def test_without_a_record_the_llama_rule_is_named(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="draftlab.convert"):
        spec = convert(write_draft(tmp_path / "sgl", layer_ids=[2, 3, 4]), tmp_path / "spec", "speculators")
    assert json.loads((spec / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [3, 4, 5]
    assert any("the Llama rule" in r.message and "[2, 3, 4]" in r.message for r in caplog.records)

"""The replay of SGLang's key mapping: what lands where, what is dropped, what is never written."""

import torch

from draftlab.sglang import keymap
from sglang_fixtures import draft_config, draft_tensors, write_draft


def shapes(tensors):
    return {k: tuple(v.shape) for k, v in tensors.items()}


def test_expected_params_current_names_and_shapes():
    params = keymap.expected_params(draft_config(), "current")
    assert params["model.fc.weight"] == (16, 48)
    assert params["model.layers.0.self_attn.qkv_proj.weight"] == ((2 + 2 * 1) * 8, 32)
    assert params["model.layers.0.mlp.gate_up_proj.weight"] == (64, 16)
    assert params["lm_head.weight"] == (32, 16)
    assert params["model.layers.0.hidden_norm.weight"] == (16,)
    assert not any("midlayer" in p for p in params)


def test_expected_params_legacy_and_tied():
    params = keymap.expected_params(draft_config(num_layers=2), "legacy")
    assert "model.midlayer.self_attn.qkv_proj.weight" in params
    assert params["model.additional_layers.0.self_attn.qkv_proj.weight"][1] == 16
    assert "model.additional_layers.0.input_layernorm.weight" not in params
    assert not any(".layers." in p for p in params)
    tied = dict(draft_config(), tie_word_embeddings=True)
    assert "lm_head.weight" not in keymap.expected_params(tied)


def test_good_export_loads_completely_under_current_rules():
    config = draft_config()
    report = keymap.map_keys(shapes(draft_tensors(config)), config, "current")
    assert report.ok, report.lines()
    assert report.has_d2t and report.ignored == ["t2d"]
    assert report.landed["layers.0.self_attn.k_proj.weight"].param == "model.layers.0.self_attn.qkv_proj.weight"
    assert report.landed["lm_head.weight"].param == "lm_head.weight"
    assert "model.embed_tokens.weight" in report.shared_from_target


def test_layers0_names_are_dropped_by_legacy_sglang():
    config = draft_config()
    report = keymap.map_keys(shapes(draft_tensors(config)), config, "legacy")
    assert "layers.0.self_attn.q_proj.weight" in report.dropped
    assert "model.midlayer.self_attn.qkv_proj.weight" in report.never_loaded
    assert report.looked_up["layers.0.self_attn.q_proj.weight"] == "layers.0.self_attn.qkv_proj.weight"
    assert "model.fc.weight" not in report.never_loaded  # fc, norm, lm_head still load: a plausible server


def test_midlayer_names_load_in_both_rule_sets():
    config = draft_config()
    keys = {k.replace("layers.0", "midlayer"): s for k, s in shapes(draft_tensors(config)).items()}
    for rules in ("current", "legacy"):
        assert keymap.map_keys(keys, config, rules).ok


def test_partial_qkv_and_wrong_shapes_are_reported():
    config = draft_config()
    keys = shapes(draft_tensors(config))
    del keys["layers.0.self_attn.v_proj.weight"]
    keys["fc.weight"] = (16, 16)
    report = keymap.map_keys(keys, config)
    assert "model.layers.0.self_attn.qkv_proj.weight[v]" in report.never_loaded
    assert [m.key for m in report.mismatches] == ["fc.weight"]
    assert any("fc.weight" in line and "expects [16, 48]" in line for line in report.lines())


def test_second_layer_needs_hidden_norm_and_its_input_layernorm_is_unused():
    config = draft_config(num_layers=2)
    old_names = {k.replace("layers.1.hidden_norm", "layers.1.input_layernorm"): v
                 for k, v in draft_tensors(config).items()}
    report = keymap.map_keys(shapes(old_names), config)
    assert "model.layers.1.hidden_norm.weight" in report.never_loaded
    assert report.unused_loaded == {"layers.1.input_layernorm.weight": "model.layers.1.input_layernorm.weight"}


def test_load_like_sglang_returns_our_names_and_omits_dropped(tmp_path):
    folder = write_draft(tmp_path / "d")
    original = draft_tensors(draft_config())
    state, report = keymap.load_like_sglang(folder, "current")
    assert report.ok
    assert set(state) == set(original)
    for key, value in original.items():
        assert torch.equal(state[key], value), key
    state, report = keymap.load_like_sglang(folder, "legacy")
    assert not any(k.startswith("layers.0.") for k in state)
    assert "fc.weight" in state and "d2t" in state


def test_load_like_sglang_splits_fused_checkpoints(tmp_path):
    config = draft_config()
    t = draft_tensors(config)
    fused = {"layers.0.self_attn.qkv_proj.weight": torch.cat([t.pop(f"layers.0.self_attn.{p}_proj.weight")
                                                               for p in "qkv"]),
             "layers.0.mlp.gate_up_proj.weight": torch.cat([t.pop("layers.0.mlp.gate_proj.weight"),
                                                            t.pop("layers.0.mlp.up_proj.weight")])}
    folder = write_draft(tmp_path / "d", drop=tuple(k for k in draft_tensors(config) if k not in t),
                         replace=fused)
    state, report = keymap.load_like_sglang(folder)
    assert report.ok, report.lines()
    key = "layers.0.self_attn.v_proj.weight"
    assert torch.equal(state[key], draft_tensors(config)[key])


def test_load_like_sglang_maps_later_layer_norms_by_what_sglang_reads(tmp_path):
    old = write_draft(tmp_path / "old", num_layers=2,
                      rename=lambda k: k.replace("layers.1.hidden_norm", "layers.1.input_layernorm"))
    state, report = keymap.load_like_sglang(old)
    assert "layers.1.hidden_norm.weight" not in state  # SGLang reads hidden_norm there: never loaded
    assert "layers.1.input_layernorm.weight" not in state  # and ignores what was saved under Llama's name
    ours = write_draft(tmp_path / "ours", num_layers=2)
    state, report = keymap.load_like_sglang(ours)
    assert report.ok
    original = draft_tensors(draft_config(num_layers=2))
    assert torch.equal(state["layers.1.hidden_norm.weight"], original["layers.1.hidden_norm.weight"])

"""The exported folder is what SGLang's LlamaForCausalLMEagle3 loads, and reads back unchanged."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftlab.sglang.export import export_draft, load_draft
from draftlab.model.draft import DraftModelConfig, Eagle3Draft

STACKED = {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v"),
           ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}


def _config(layers=1, **kw) -> DraftModelConfig:
    base = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                target_hidden_size=24, aux_layer_ids=[1, 4, 7], vocab_size=64, draft_vocab_size=40,
                num_hidden_layers=layers, max_position_embeddings=4096)
    base.update(kw)
    return DraftModelConfig(**base)


def sglang_params(c: dict) -> dict[str, tuple]:
    """named_parameters() of SGLang's LlamaForCausalLMEagle3 for config.json `c` (sglang-eagle3.md 1.3)."""
    H, I, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    n_aux = len(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    p = {"model.embed_tokens.weight": (c["vocab_size"], H),
         "model.fc.weight": (H, n_aux * c["target_hidden_size"]),
         "model.norm.weight": (H,), "lm_head.weight": (c["draft_vocab_size"], H)}
    for i in range(c["num_hidden_layers"]):
        L = f"model.layers.{i}."
        p[L + "self_attn.qkv_proj.weight"] = ((nh + 2 * nkv) * hd, 2 * H if i == 0 else H)
        p[L + "self_attn.o_proj.weight"] = (H, nh * hd)
        p[L + "mlp.gate_up_proj.weight"] = (2 * I, H)
        p[L + "mlp.down_proj.weight"] = (H, I)
        p[L + "hidden_norm.weight"] = (H,)  # every layer has one; layers >= 1 normalise their input with it
        p[L + "post_attention_layernorm.weight"] = (H,)
        if i == 0:  # SGLang's later layers inherit an input_layernorm that their forward never reads
            p[L + "input_layernorm.weight"] = (H,)
    return p


def sglang_load(params: dict[str, tuple], tensors: dict[str, torch.Tensor]) -> tuple[dict, list, dict]:
    """SGLang's load_weights rules (sglang-eagle3.md 1.4), applied to shapes: returns
    (rows loaded per param and shard, keys silently dropped, special tensors)."""
    loaded: dict[str, dict] = {}
    dropped, special = [], {}
    for name, t in tensors.items():
        if "d2t" in name or "t2d" in name:
            special[name] = t
            continue
        shard = None
        for old, (new, shard_id) in STACKED.items():
            if old in name:
                name, shard = name.replace(old, new), shard_id
                break
        target = name if name in params else f"model.{name}"
        if target not in params:
            dropped.append(name)
            continue
        loaded.setdefault(target, {})[shard] = tuple(t.shape)
    return loaded, dropped, special


@pytest.mark.parametrize("layers", [1, 2])
def test_export_matches_sglang_parameter_list(tmp_path, layers):
    cfg = _config(layers)
    folder = export_draft(Eagle3Draft(cfg), cfg, tmp_path / "draft")
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    params = sglang_params(config)
    loaded, dropped, special = sglang_load(params, tensors)
    assert dropped == []  # nothing silently skipped
    assert set(loaded) == set(params)  # nothing left uninitialised
    for name, shape in params.items():
        shards = loaded[name]
        if None in shards:
            assert shards[None] == shape, name
        else:  # stacked: the shards' rows add up to the fused parameter, same input width
            assert sum(s[0] for s in shards.values()) == shape[0] and {s[1] for s in shards.values()} == {shape[1]}
            assert set(shards) in ({"q", "k", "v"}, {0, 1}), name
    assert special["d2t"].dtype == torch.int64 and special["d2t"].shape == (config["draft_vocab_size"],)
    assert special["t2d"].dtype == torch.bool and special["t2d"].shape == (config["vocab_size"],)
    assert all(v.dtype == torch.bfloat16 for k, v in tensors.items() if k not in special)


def test_config_json_fields(tmp_path):
    cfg = _config()
    config = json.loads((export_draft(Eagle3Draft(cfg), cfg, tmp_path / "d", "float16") / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is False and config["torch_dtype"] == "float16"
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 4, 7]
    for key, value in (("draft_vocab_size", 40), ("vocab_size", 64), ("hidden_size", 32), ("target_hidden_size", 24),
                       ("num_hidden_layers", 1), ("intermediate_size", 48), ("num_attention_heads", 4),
                       ("num_key_value_heads", 2), ("head_dim", 8), ("max_position_embeddings", 4096)):
        assert config[key] == value, key
    assert {"rms_norm_eps", "rope_theta"} <= set(config)


def test_round_trip(tmp_path):
    torch.manual_seed(0)
    cfg = _config(layers=2)
    model = Eagle3Draft(cfg)
    with torch.no_grad():
        model.d2t.copy_(torch.randint(0, 24, (40,)))
        model.t2d[::2] = True
    folder = export_draft(model, cfg, tmp_path / "draft", "float32")
    again = load_draft(folder)
    assert again.cfg == cfg
    for k, v in model.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k
    ids = torch.randint(0, 64, (1, 6))
    feats = torch.randn(1, 6, 72)
    pos = torch.arange(6)[None]
    assert torch.equal(model(ids, feats, pos)[0], again(ids, feats, pos)[0])
    # exporting again replaces the folder atomically (no leftovers beside it)
    export_draft(model, cfg, folder, "bfloat16")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]
    assert load_draft(folder).cfg == cfg


def test_a_stop_between_the_swap_renames_puts_the_old_folder_back(tmp_path, monkeypatch):
    """Re-exporting swaps folders with two renames; stopped between them, the previous folder goes back and
    nothing is left beside it (a kill that skips the clean-up leaves `.*.tmp` names the pipeline sweeps)."""
    from draftlab.util import fsutil

    cfg = _config()
    model = Eagle3Draft(cfg)
    folder = export_draft(model, cfg, tmp_path / "draft", "float32")
    real, renames = os.replace, []

    def stop_after_the_first_rename(src, dst):
        real(src, dst)
        if Path(src) == folder:  # the old folder moved aside, the new one not yet in
            renames.append(str(dst))
            raise KeyboardInterrupt("killed between the renames")

    monkeypatch.setattr(fsutil.os, "replace", stop_after_the_first_rename)
    with pytest.raises(KeyboardInterrupt):
        export_draft(model, cfg, folder, "float32")
    monkeypatch.setattr(fsutil.os, "replace", real)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"] and (folder / "model.safetensors").exists()
    assert renames and renames[0].endswith(".tmp")  # the sweep's pattern, should a kill skip the clean-up
    export_draft(model, cfg, folder, "float32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]

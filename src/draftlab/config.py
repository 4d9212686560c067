"""The typed schema of draftlab's config, and the one place that validates it.

Hydra composes `conf/` into a DictConfig; `validate` merges it onto these dataclasses, so a misspelt key or a
wrong type fails with the full dotted key, then checks values that types cannot express. The schema is not in
Hydra's defaults list on purpose: DVC composes `conf/` without importing draftlab.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A config value is wrong; the message starts with the dotted key."""


STAGE_NAMES = ("generate", "extract", "train", "bench")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class TinyArch:
    """The in-code random Llama used by tests (`target=tiny`)."""

    num_hidden_layers: int = 8
    hidden_size: int = 64
    intermediate_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    seed: int = 0


@dataclass
class TargetConfig:
    name: str = "smollm2"  # smollm2 (embedded GGUF) | tiny (in code) | hf (target.path)
    path: Optional[str] = None  # Hugging Face folder or hub name, for name=hf
    gguf_file: Optional[str] = None  # a GGUF inside target.path, if any
    dtype: str = "auto"  # auto = bfloat16 on CUDA, float32 on CPU
    device: str = "auto"  # auto = cuda when available, else cpu
    device_map: Optional[str] = None  # e.g. auto: split the target over the visible GPUs (accelerate); wins over device
    tiny: TinyArch = field(default_factory=TinyArch)


@dataclass
class ServerConfig:
    """A running SGLang or vLLM server that answers the prompts when data.engine=server (draftlab/serve/remote.py)."""

    url: Optional[str] = None  # http://host:port; None = draftlab starts SGLang for the target (serve.* settings)
    api: str = "auto"  # auto (ask the server) | sglang (native /generate) | vllm (/v1/completions)
    concurrency: int = 32  # requests in flight
    retries: int = 5  # per request, on transient errors (connection refused/reset, 429, 5xx), with backoff
    timeout_s: float = 600.0  # per request
    model: Optional[str] = None  # vLLM's served model name (None = the server's only model)


@dataclass
class DataConfig:
    source: str = "sharegpt"  # sharegpt (embedded package) | jsonl | parquet
    path: Optional[str] = None  # file for jsonl/parquet (sharegpt: optional override of the JSON file)
    samples: int = 48
    max_new_tokens: int = 64
    max_prompt_tokens: int = 256
    val_fraction: float = 0.125
    seed: int = 0
    temperature: float = 0.0  # 0 = greedy
    batch_size: int = 16
    shard_size: int = 64  # samples per shard: the unit of resume
    engine: str = "hf"  # hf (transformers, in this process) | server (data.server.*)
    server: ServerConfig = field(default_factory=ServerConfig)


@dataclass
class ExtractConfig:
    layers: Any = "auto"  # auto | last | ascending list of layer ids (output of decoder layer k)
    dtype: str = "bfloat16"  # storage dtype: bfloat16 | float16 | float32
    mode: str = "offline"  # offline (stored shards) | online (train runs the target)
    batch_size: int = 8
    shard_size: int = 64


@dataclass
class DraftConfig:
    vocab_size: int = 8192  # draft vocabulary (most frequent assistant tokens)
    num_layers: int = 1
    hidden_size: Optional[int] = None  # None = the target's
    intermediate_size: Optional[int] = None
    num_heads: Optional[int] = None
    num_kv_heads: Optional[int] = None


@dataclass
class TrainConfig:
    epochs: int = 3
    lr: float = 1e-3
    schedule: str = "cosine"  # cosine | linear | constant
    warmup_ratio: float = 0.05
    ttt_steps: int = 7
    loss_decay: float = 0.8
    batch_tokens: int = 4096
    max_seq_len: int = 2048
    grad_clip: float = 0.5
    weight_decay: float = 0.0
    seed: int = 0
    log_every: int = 10
    checkpoint_every: int = 50  # optimiser steps between resumable checkpoints
    device: str = "auto"
    dtype: str = "auto"  # auto = bfloat16 autocast on CUDA, float32 on CPU
    init_from: Optional[str] = None  # a checkpoint to continue from (epochs sweep)
    strategy: str = "auto"  # under torchrun: auto (= ddp when WORLD_SIZE > 1) | ddp | fsdp (FSDP2 fully_shard)


@dataclass
class ServeConfig:
    backend: str = "local"  # local (draftlab's engine) | sglang
    num_steps: int = 4  # draft tokens per verification (chain)
    topk: int = 1
    num_draft_tokens: Optional[int] = None  # None = num_steps + 1 for a chain
    algorithm: str = "EAGLE3"
    dtype: str = "auto"
    device: str = "auto"
    tp_size: int = 1
    mem_fraction_static: Optional[float] = None
    cuda_graph: bool = True
    cuda_graph_max_bs: Optional[int] = None
    host: str = "127.0.0.1"
    port: int = 30000
    startup_timeout_s: float = 1200.0
    sglang_rules: str = "current"  # current | legacy (only midlayer.* names)
    draft_format: str = "sglang"  # sglang | speculators
    python: str = "python"  # interpreter that has sglang installed
    extra_args: list = field(default_factory=list)


@dataclass
class BenchConfig:
    prompts: int = 6  # held-out (validation) prompts
    max_new_tokens: int = 48
    temperature: float = 0.0
    tau_ratio_warn: float = 0.6  # warn when bench/tau / val/predicted_tau is below this
    tau_fail: float = 1.05  # fail when bench/tau is at or below this: the draft contributes nothing
    seed: int = 0


@dataclass
class TrackingConfig:
    experiment: str = "draftlab"
    uri: Optional[str] = None  # None = MLFLOW_TRACKING_URI or sqlite:///<repo>/mlruns/mlflow.db
    enabled: bool = True
    run_name: Optional[str] = None


@dataclass
class PathsConfig:
    root: str = "outputs"  # every stage output and cache lives under here


@dataclass
class Config:
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    stages: list = field(default_factory=lambda: list(STAGE_NAMES))


def _choice(key: str, value: Any, options: tuple) -> None:
    if value not in options:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, options))}")


def _positive(key: str, value: Any, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def check_layers_spec(value: Any) -> None:
    """Checks the form of extract.layers; range checks need the target and live in data/features.py."""
    if isinstance(value, str):
        _choice("extract.layers", value, ("auto", "last"))
        return
    if not isinstance(value, (list, tuple, ListConfig)) or not value:
        raise ConfigError(f"extract.layers: expected auto, last or a list of layer ids, got {value!r}")
    ids = list(value)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f"extract.layers: layer ids must be integers, got {ids}")
    if any(i < 0 for i in ids):
        raise ConfigError(f"extract.layers: layer ids must be >= 0, got {ids}")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"extract.layers: layer ids must be unique, got {ids}")
    if ids != sorted(ids):
        raise ConfigError(f"extract.layers: layer ids must be ascending (SGLang concatenates in ascending order), got {ids}")


def _check_values(c: DictConfig) -> None:
    _choice("target.name", c.target.name, ("smollm2", "tiny", "hf"))
    if c.target.name == "hf" and not c.target.path:
        raise ConfigError("target.path: required when target.name=hf (a Hugging Face model folder or name)")
    _choice("target.dtype", c.target.dtype, DTYPES)
    if c.target.device_map and c.target.name == "tiny":
        raise ConfigError("target.device_map: the tiny target is built in code on one device; use target=smollm2|hf")
    _choice("data.source", c.data.source, ("sharegpt", "jsonl", "parquet"))
    if c.data.source != "sharegpt" and not c.data.path:
        raise ConfigError(f"data.path: required when data.source={c.data.source}")
    for key in ("samples", "max_new_tokens", "max_prompt_tokens", "batch_size", "shard_size"):
        _positive(f"data.{key}", c.data[key])
    if c.data.shard_size % c.data.batch_size:
        raise ConfigError(f"data.shard_size: must be a multiple of data.batch_size ({c.data.batch_size}), "
                          f"got {c.data.shard_size}")
    if not 0.0 <= c.data.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction: must be in [0, 1), got {c.data.val_fraction}")
    _positive("data.temperature", c.data.temperature, allow_zero=True)
    _choice("data.engine", c.data.engine, ("hf", "server"))
    _choice("data.server.api", c.data.server.api, ("auto", "sglang", "vllm"))
    _positive("data.server.concurrency", c.data.server.concurrency)
    _positive("data.server.retries", c.data.server.retries, allow_zero=True)
    _positive("data.server.timeout_s", c.data.server.timeout_s)
    if c.data.server.url and not str(c.data.server.url).startswith(("http://", "https://")):
        raise ConfigError(f"data.server.url: expected http://host:port, got {c.data.server.url!r}")
    if c.data.engine == "server" and not c.data.server.url and c.target.name == "tiny":
        raise ConfigError("data.server.url: required with target=tiny (no engine can load the in-code model)")
    check_layers_spec(c.extract.layers)
    _choice("extract.dtype", c.extract.dtype, ("bfloat16", "float16", "float32"))
    _choice("extract.mode", c.extract.mode, ("offline", "online"))
    _positive("extract.batch_size", c.extract.batch_size)
    _positive("extract.shard_size", c.extract.shard_size)
    for key in ("vocab_size", "num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads"):
        _positive(f"draft.{key}", c.draft[key])
    _positive("train.epochs", c.train.epochs)
    _positive("train.lr", c.train.lr)
    _choice("train.schedule", c.train.schedule, ("cosine", "linear", "constant"))
    if not 0.0 <= c.train.warmup_ratio < 1.0:
        raise ConfigError(f"train.warmup_ratio: must be in [0, 1), got {c.train.warmup_ratio}")
    for key in ("ttt_steps", "batch_tokens", "max_seq_len", "log_every", "checkpoint_every"):
        _positive(f"train.{key}", c.train[key])
    if not 0.0 < c.train.loss_decay <= 1.0:
        raise ConfigError(f"train.loss_decay: must be in (0, 1], got {c.train.loss_decay}")
    _positive("train.grad_clip", c.train.grad_clip, allow_zero=True)
    _choice("train.dtype", c.train.dtype, DTYPES)
    _choice("train.strategy", c.train.strategy, ("auto", "ddp", "fsdp"))
    if c.train.init_from not in (None, "shorter") and not Path(c.train.init_from).exists():
        raise ConfigError(f"train.init_from: {c.train.init_from} does not exist (a checkpoint or train folder, "
                          "or 'shorter')")
    _choice("serve.backend", c.serve.backend, ("local", "sglang"))
    _positive("serve.num_steps", c.serve.num_steps)
    _positive("serve.topk", c.serve.topk)
    _choice("serve.sglang_rules", c.serve.sglang_rules, ("current", "legacy"))
    _choice("serve.draft_format", c.serve.draft_format, ("sglang", "speculators"))
    _choice("serve.dtype", c.serve.dtype, DTYPES)
    _positive("bench.prompts", c.bench.prompts)
    _positive("bench.max_new_tokens", c.bench.max_new_tokens)
    _positive("bench.temperature", c.bench.temperature, allow_zero=True)
    if not c.stages:
        raise ConfigError("stages: at least one stage is needed")
    for name in c.stages:
        _choice("stages", name, STAGE_NAMES)


def validate(cfg: DictConfig | dict) -> DictConfig:
    """Returns the config merged onto the schema, resolved and read-only; raises ConfigError naming the key."""
    schema = OmegaConf.structured(Config)
    try:
        merged = OmegaConf.merge(schema, cfg)
        OmegaConf.resolve(merged)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "config"
        message = str(err).splitlines()[0]
        raise ConfigError(f"{key}: {message}") from None
    _check_values(merged)
    OmegaConf.set_readonly(merged, True)
    return merged


def default_config(overrides: dict | None = None) -> DictConfig:
    """The schema defaults with optional nested overrides, validated. Handy in tests and benchmarks."""
    return validate(overrides or {})

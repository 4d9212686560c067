"""The typed schema of draftlab's config: types and docs, every value MISSING (values live in conf/).

`draftlab.config.config.validate` merges the composed conf/ onto `Config`, so a misspelt key or a wrong type fails with
the full dotted key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


@dataclass
class TinyArch:
    """The in-code random Llama used by tests (`target=tiny`)."""

    num_hidden_layers: int = MISSING
    hidden_size: int = MISSING
    intermediate_size: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    max_position_embeddings: int = MISSING
    seed: int = MISSING


@dataclass
class TargetConfig:
    name: str = MISSING  # smollm2 (embedded GGUF) | tiny (in code) | hf (target.path)
    path: Optional[str] = MISSING  # Hugging Face folder or hub name, for name=hf
    gguf_file: Optional[str] = MISSING  # a GGUF inside target.path, if any
    dtype: str = MISSING  # auto = bfloat16 on CUDA, float32 on CPU
    device: str = MISSING  # auto = cuda when available, else cpu
    # e.g. auto: split the target over the visible GPUs (accelerate); wins over device
    device_map: Optional[str] = MISSING
    # true: a target class missing from SGLang's capture contract is extracted with Llama's convention, unchecked
    allow_unlisted_arch: bool = MISSING
    tiny: Optional[TinyArch] = None  # the in-code model's shape, set by target=tiny (conf/target/tiny.yaml)


@dataclass
class ServerConfig:
    """A running SGLang or vLLM server that answers the prompts when data.engine=server (draftlab/serve/remote.py)."""

    url: Optional[str] = MISSING  # http://host:port; None = draftlab starts SGLang for the target (serve.* settings)
    api: str = MISSING  # auto (ask the server) | sglang (native /generate) | vllm (/v1/completions)
    concurrency: int = MISSING  # requests in flight
    retries: int = MISSING  # per request, on transient errors (connection refused/reset, 429, 5xx), with backoff
    timeout_s: float = MISSING  # per request
    model: Optional[str] = MISSING  # vLLM's served model name (None = the server's only model)


@dataclass
class DataConfig:
    source: str = MISSING  # sharegpt (embedded package) | jsonl | parquet
    path: Optional[str] = MISSING  # file for jsonl/parquet (sharegpt: optional override of the JSON file)
    samples: int = MISSING
    max_new_tokens: int = MISSING
    max_prompt_tokens: int = MISSING
    val_fraction: float = MISSING
    # > 0: one validation set for every data.samples: the first val_samples held-out prompts, drawn before the
    # training pool (data/prompts.pool_order); 0: each job's validation set is the held-out share of its samples
    val_samples: int = MISSING
    seed: int = MISSING
    temperature: float = MISSING  # 0 = greedy
    batch_size: int = MISSING
    shard_size: int = MISSING  # samples per shard: the unit of resume
    generator: str = MISSING  # plain | static (compiled decode) | graphs (CUDA-graph decode, refill) | continuous
    compile_decode: bool = MISSING  # graphs: torch.compile the decode step before its capture
    engine: str = MISSING  # hf (transformers, in this process) | server (data.server.*)
    server: ServerConfig = field(default_factory=ServerConfig)


@dataclass
class ExtractConfig:
    layers: Any = MISSING  # auto | last | ascending list of layer ids (output of decoder layer k)
    dtype: str = MISSING  # storage dtype: bfloat16 | float16 | float32
    mode: str = MISSING  # offline (stored shards) | online (train runs the target)
    batch_size: int = MISSING
    shard_size: int = MISSING
    writers: int = MISSING  # threads writing shards: more help only where one cannot keep up with the forward
    pool_root: Optional[str] = MISSING  # where `src/run.py` keeps the pool; None = under paths.root


@dataclass
class DraftConfig:
    vocab_size: int = MISSING  # draft vocabulary (most frequent assistant tokens)
    num_layers: int = MISSING
    hidden_size: Optional[int] = MISSING  # None = the target's
    intermediate_size: Optional[int] = MISSING
    num_heads: Optional[int] = MISSING
    num_kv_heads: Optional[int] = MISSING


@dataclass
class TrainConfig:
    epochs: Optional[int] = None  # the budget in passes over the data, when max_steps is None
    max_steps: Optional[int] = 60  # the budget in optimizer steps; replaces epochs and sizes the schedule
    eval_every: Optional[int] = None  # optimizer steps between validation passes; None = once per epoch
    early_stop_patience: Optional[int] = 4  # the plateau test's look-ahead in validation passes; None = off
    early_stop_min_delta: float = 0.005  # material: a val/loss gain of this fraction of it (train/schedule.py)
    plateau_test: str = "slope"  # slope (the recent val/loss slope's interval) | delta (no min_delta gain)
    early_stop_level: float = 0.9  # the slope interval's level
    extend_steps: int = 0  # the steps probe: constant-lr steps past the plateau before the wsd decay; 0 = none
    bench_every: Optional[int] = 20  # optimizer steps between benches of the draft in training (train/bench_tau.py)
    bench_prompts: int = 4  # validation prompts each of those benches decodes
    bench_max_new_tokens: int = 32  # new tokens per prompt in those benches
    stop_on: str = "loss"  # loss | tau: what early stopping and the best checkpoint read (tau: train/bench_tau)
    lr: float = 1e-3
    schedule: str = "wsd"  # cosine | linear | constant | wsd (warmup-stable-decay)
    warmup_ratio: float = 0.05
    decay_ratio: float = 0.2  # wsd: the decay phase, as a fraction of the steps before it
    ttt_steps: int = 7
    loss_decay: float = 0.8
    freeze_lm_head: bool = False  # the draft head kept at the target head's draft-vocab rows (speculators' choice)
    batch_tokens: int = 4096
    plan_window: int = 256  # samples sorted by length together before batches are cut (data/reader.plan_batches)
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
    compile_loss: str = "auto"  # auto (= on CUDA) | true | false: the soft cross-entropy under torch.compile
    compile_unroll: str = "auto"  # auto (= on CUDA) | true | false: the packed unroll (forward + loss) compiled
    compile_cpp_wrapper: bool = False  # the compiled unroll launches its kernels from C++ (Inductor's cpp_wrapper)
    # auto (= on CUDA for a narrow draft: train/compile_choice.py) | true | false: the compiled unroll replayed as
    # CUDA graphs, batches padded to few sizes
    compile_cuda_graphs: str = "false"
    # under compile_cuda_graphs: the plan's counts padded to a multiple of this; None = batch_tokens / 8
    graph_count_bucket: Optional[int] = None
    # auto (= when the unroll is compiled and generate or extract run first) | true | false: build its graphs in
    # background processes while they run (draftlab/warmup/launch.py)
    compile_warmup: str = "auto"


@dataclass
class ServeConfig:
    backend: str = MISSING  # local (draftlab's engine) | sglang | both
    num_steps: int = MISSING  # draft tokens per verification (chain)
    topk: int = MISSING
    num_draft_tokens: Optional[int] = MISSING  # None = num_steps + 1 for a chain
    algorithm: str = MISSING
    dtype: str = MISSING
    device: str = MISSING
    tp_size: int = MISSING
    mem_fraction_static: Optional[float] = MISSING
    cuda_graph: bool = MISSING
    cuda_graph_max_bs: Optional[int] = MISSING
    host: str = MISSING
    port: int = MISSING
    startup_timeout_s: float = MISSING
    sglang_rules: str = MISSING  # current | legacy (only midlayer.* names)
    sglang_version: Optional[str] = MISSING  # whose capture contract applies; None = the installed sglang's
    draft_format: str = MISSING  # sglang | speculators
    python: str = MISSING  # interpreter that has sglang installed
    extra_args: list = MISSING
    env: dict = MISSING  # environment variables for the server process only (its own PYTHONPATH, say)


@dataclass
class BenchConfig:
    prompts: int = MISSING  # held-out (validation) prompts
    max_new_tokens: int = MISSING
    temperature: float = MISSING
    tau_ratio_warn: float = MISSING  # warn when bench/tau / val/predicted_tau is below this
    tau_fail: float = MISSING  # fail when bench/tau is at or below this: the draft contributes nothing
    seed: int = MISSING
    static_cache: bool = MISSING  # local engine: preallocated KV caches, fixed-shape steps (false = dynamic)
    cuda_graphs: str = MISSING  # auto | true | false: those steps as CUDA graphs (auto = on for a CUDA target)
    sets: list = MISSING  # sharegpt_val | humaneval | a .jsonl/.parquet prompt file (data/bench_sets.py)
    batch_sizes: list = MISSING  # rows decoded at once (local) or requests in flight (SGLang): bench/bs<B>/...
    sglang_grid: list = MISSING  # [steps, topk(, num_draft_tokens)] settings, each one SGLang start
    grid_prompts: Optional[int] = MISSING  # the first set's first N prompts for each grid setting (None = all)


@dataclass
class TrackingConfig:
    experiment: str = MISSING
    uri: Optional[str] = MISSING  # None = MLFLOW_TRACKING_URI or sqlite:///<repo>/mlruns/mlflow.db
    enabled: bool = MISSING
    run_name: Optional[str] = MISSING


@dataclass
class PathsConfig:
    root: str = MISSING  # every stage output and cache lives under here


@dataclass
class HardwareConfig:
    """Which preset (conf/hardware) set the batch sizes, dtypes and fast paths; informational."""

    name: str = MISSING  # cpu | gpu


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
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    stages: list = MISSING

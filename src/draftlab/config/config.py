"""The one place that validates draftlab's config against its typed schema (config_schema.py).

Hydra composes `conf/` into a DictConfig; `validate` merges it onto these dataclasses, so a misspelt key or a
wrong type fails with the full dotted key, then checks values that types cannot express. The schema is not in
Hydra's defaults list on purpose: DVC composes `conf/` without importing draftlab.

Values live in one place, `conf/`: the schema holds types, docs and checks, and its fields are MISSING, so a
key that conf/ forgets fails validation instead of silently taking a second, drifting default.
(`TrainConfig` still carries values until the training-budget work lands; tests/integration/test_config.py pins every
value the schema holds to the composed conf/.) `default_config()` is a compose of conf/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from draftlab.config.config_schema import Config, TinyArch


class ConfigError(ValueError):
    """A config value is wrong; the message starts with the dotted key."""


STAGE_NAMES = ("generate", "extract", "train", "bench")
DTYPES = ("auto", "float32", "bfloat16", "float16")
SCHEDULES = ("cosine", "linear", "constant", "wsd")


def _choice(key: str, value: Any, options: tuple) -> None:
    if value not in options:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, options))}")


def _positive(key: str, value: Any, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def check_layers_spec(value: Any) -> None:
    """Checks the form of extract.layers; range checks need the target and live in data/layers.py (resolve_layers)."""
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
        raise ConfigError(f"extract.layers: layer ids must be ascending (SGLang concatenates in ascending order), "
                          f"got {ids}")


def _check_values(c: DictConfig) -> None:
    _choice("target.name", c.target.name, ("smollm2", "tiny", "hf"))
    if c.target.name == "hf" and not c.target.path:
        raise ConfigError("target.path: required when target.name=hf (a Hugging Face model folder or name)")
    _choice("target.dtype", c.target.dtype, DTYPES)
    for key, value in (c.target.tiny or {}).items():  # the in-code model's shape and seed
        _positive(f"target.tiny.{key}", value, allow_zero=key == "seed")
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
    _positive("data.val_samples", c.data.val_samples, allow_zero=True)
    if c.data.val_samples and not c.data.val_fraction:
        raise ConfigError("data.val_samples: the fixed validation set is drawn from the held-out prompts; "
                          "data.val_fraction=0 holds out none")
    _positive("data.temperature", c.data.temperature, allow_zero=True)
    _choice("data.generator", c.data.generator, ("plain", "static", "graphs", "continuous"))
    if c.data.generator == "graphs" and c.target.device_map:  # one static KV cache, one graph, one device
        raise ConfigError("data.generator: graphs needs the target on one device, but target.device_map is set; "
                          "use data.generator=plain")
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
    _positive("extract.writers", c.extract.writers)
    for key in ("vocab_size", "num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads"):
        _positive(f"draft.{key}", c.draft[key])
    _positive("train.epochs", c.train.epochs)
    if c.train.max_steps is None and c.train.epochs is None:
        raise ConfigError("train.max_steps: no training budget; set train.max_steps (optimizer steps) or "
                          "train.epochs (passes over the data)")
    if c.train.init_from == "shorter" and c.train.epochs is None:
        raise ConfigError("train.init_from: 'shorter' continues the run with fewer train.epochs; set train.epochs "
                          "(and train.max_steps=null)")
    for key in ("max_steps", "eval_every", "early_stop_patience"):
        _positive(f"train.{key}", c.train[key])
    if not 0.0 <= c.train.early_stop_min_delta < 1.0:
        raise ConfigError(f"train.early_stop_min_delta: must be in [0, 1) (a fraction of val/loss), "
                          f"got {c.train.early_stop_min_delta}")
    _choice("train.plateau_test", c.train.plateau_test, ("slope", "delta"))
    if not 0.0 < c.train.early_stop_level < 1.0:
        raise ConfigError(f"train.early_stop_level: must be in (0, 1), got {c.train.early_stop_level}")
    if c.train.extend_steps < 0 or (c.train.extend_steps and not c.train.early_stop_patience):
        raise ConfigError(f"train.extend_steps: {c.train.extend_steps}; must be >= 0, and continues past the "
                          "plateau, so it needs train.early_stop_patience")
    for key in ("bench_every", "bench_prompts", "bench_max_new_tokens"):
        _positive(f"train.{key}", c.train[key])
    _choice("train.stop_on", c.train.stop_on, ("loss", "tau"))
    if c.train.stop_on == "tau" and not c.train.bench_every:
        raise ConfigError("train.stop_on: tau reads train/bench_tau, which train.bench_every measures; set it")
    if not 0.0 < c.train.decay_ratio <= 1.0:
        raise ConfigError(f"train.decay_ratio: must be in (0, 1], got {c.train.decay_ratio}")
    _positive("train.lr", c.train.lr)
    _choice("train.schedule", c.train.schedule, SCHEDULES)
    if not 0.0 <= c.train.warmup_ratio < 1.0:
        raise ConfigError(f"train.warmup_ratio: must be in [0, 1), got {c.train.warmup_ratio}")
    for key in ("ttt_steps", "batch_tokens", "plan_window", "max_seq_len", "log_every", "checkpoint_every",
                "graph_count_bucket"):
        _positive(f"train.{key}", c.train[key])
    if not 0.0 < c.train.loss_decay <= 1.0:
        raise ConfigError(f"train.loss_decay: must be in (0, 1], got {c.train.loss_decay}")
    _positive("train.grad_clip", c.train.grad_clip, allow_zero=True)
    _choice("train.dtype", c.train.dtype, DTYPES)
    _choice("train.strategy", c.train.strategy, ("auto", "ddp", "fsdp"))
    _choice("train.compile_loss", str(c.train.compile_loss).lower(), ("auto", "true", "false"))
    _choice("train.compile_unroll", str(c.train.compile_unroll).lower(), ("auto", "true", "false"))
    _choice("train.compile_cuda_graphs", str(c.train.compile_cuda_graphs).lower(), ("auto", "true", "false"))
    _choice("train.compile_warmup", str(c.train.compile_warmup).lower(), ("auto", "true", "false"))
    if c.train.init_from not in (None, "shorter") and not Path(c.train.init_from).exists():
        raise ConfigError(f"train.init_from: {c.train.init_from} does not exist (a checkpoint or train folder, "
                          "or 'shorter')")
    for key in ("data.seed", "train.seed", "bench.seed"):  # numpy's generators refuse a negative seed
        _positive(key, OmegaConf.select(c, key), allow_zero=True)
    _choice("serve.backend", c.serve.backend, ("local", "sglang", "both"))
    _positive("serve.tp_size", c.serve.tp_size)
    _positive("serve.startup_timeout_s", c.serve.startup_timeout_s)
    _positive("serve.cuda_graph_max_bs", c.serve.cuda_graph_max_bs)
    if not 1 <= c.serve.port <= 65535:
        raise ConfigError(f"serve.port: must be a TCP port, 1 to 65535, got {c.serve.port}")
    if c.serve.mem_fraction_static is not None and not 0.0 < c.serve.mem_fraction_static < 1.0:
        raise ConfigError(f"serve.mem_fraction_static: must be in (0, 1), got {c.serve.mem_fraction_static}")
    _positive("serve.num_steps", c.serve.num_steps)
    _positive("serve.topk", c.serve.topk)
    _choice("serve.sglang_rules", c.serve.sglang_rules, ("current", "legacy"))
    _choice("serve.draft_format", c.serve.draft_format, ("sglang", "speculators"))
    _choice("serve.dtype", c.serve.dtype, DTYPES)
    _positive("bench.prompts", c.bench.prompts)
    _positive("bench.max_new_tokens", c.bench.max_new_tokens)
    _positive("bench.temperature", c.bench.temperature, allow_zero=True)
    _choice("bench.cuda_graphs", str(c.bench.cuda_graphs).lower(), ("auto", "true", "false"))
    if str(c.bench.cuda_graphs).lower() == "true" and not c.bench.static_cache:
        raise ConfigError("bench.cuda_graphs: true needs fixed shapes, i.e. bench.static_cache=true")
    _check_bench_lists(c.bench)
    if not c.stages:
        raise ConfigError("stages: at least one stage is needed")
    for name in c.stages:
        _choice("stages", name, STAGE_NAMES)


def _check_bench_lists(bench) -> None:
    """bench.batch_sizes; bench.sets names files, so preflight checks it (data/bench_sets.py)."""
    sizes = bench.batch_sizes
    if not isinstance(sizes, (list, ListConfig)) or not sizes:
        raise ConfigError(f"bench.batch_sizes: expected a non-empty list of batch sizes, got {sizes!r}")
    if not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in sizes):
        raise ConfigError(f"bench.batch_sizes: batch sizes must be integers > 0, got {list(sizes)}")
    if len(set(sizes)) != len(sizes):
        raise ConfigError(f"bench.batch_sizes: batch sizes must be unique, got {list(sizes)}")
    grid = bench.sglang_grid
    if not isinstance(grid, (list, ListConfig)):
        raise ConfigError(f"bench.sglang_grid: expected a list of [steps, topk(, num_draft_tokens)], got {grid!r}")
    for i, entry in enumerate(grid):
        values = list(entry) if isinstance(entry, (list, ListConfig)) else []
        if len(values) not in (2, 3) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                for v in values):
            raise ConfigError(f"bench.sglang_grid[{i}]: {entry!r} is not [steps, topk] or [steps, topk, "
                              "num_draft_tokens] of integers > 0")
    if bench.grid_prompts is not None:
        _positive("bench.grid_prompts", bench.grid_prompts)


def validate(cfg: DictConfig | dict) -> DictConfig:
    """Returns the config merged onto the schema, resolved and read-only; raises ConfigError naming the key."""
    schema = OmegaConf.structured(Config)
    try:
        merged = OmegaConf.merge(schema, cfg)
        OmegaConf.resolve(merged)
        if merged.target.name == "tiny":  # a config that names only the tiny target (benches): its conf/ shape
            merged.target.tiny = OmegaConf.merge(TinyArch, tiny_arch(), merged.target.tiny or {})
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "config"
        message = str(err).splitlines()[0]
        raise ConfigError(f"{key}: {message}") from None
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:
        raise ConfigError(f"{missing[0]}: no value (conf/ sets every key; was it composed?)")
    _check_values(merged)
    OmegaConf.set_readonly(merged, True)
    return merged


CONF_DIR = Path(__file__).resolve().parents[3] / "conf"


def compose_conf(overrides: list[str] | None = None) -> DictConfig:
    """conf/ composed as `src/run.py` composes it (command-line style overrides), not yet validated."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # inside a Hydra app (its config path is this conf/)
        return compose("config", overrides=list(overrides or []))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides or []))


def check_overrides(args: list[str]) -> None:
    """src/run.py's overrides composed as Hydra will compose them, before Hydra does: a misspelt key or an unknown
    option is refused in one line naming it (Hydra prints several and exits 1). A sweep is checked by its key;
    a command naming another config is left to Hydra, as is anything else this cannot judge."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    if any(a.split("=")[0] in ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir") for a in args):
        return
    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        single = [o.input_line for o in parsed if not o.is_sweep_override() and not o.key_or_group.startswith("hydra")]
        composed = compose_conf(single)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"overrides: {' '.join(str(err).strip().splitlines()[:2])}") from None
    for o in parsed:
        key = o.key_or_group
        if (o.is_sweep_override() and o.type == OverrideType.CHANGE and key.split("/")[0] not in groups | {"hydra"}
                and OmegaConf.select(composed, key, default=_ABSENT) is _ABSENT):
            raise ConfigError(f"{key}: no such key in the composed config (a misspelling?)")


_ABSENT = object()


def default_config(overrides: dict | None = None) -> DictConfig:
    """The composed conf/ with optional nested overrides, validated. Handy in tests and benchmarks."""
    composed = compose_conf()
    OmegaConf.set_struct(composed, False)  # the schema, in validate, refuses unknown keys with their name
    composed = OmegaConf.merge(composed, overrides or {})
    return validate(composed)


def tiny_arch() -> DictConfig:
    """The tiny target's shape from conf/target/tiny.yaml (cheap: one file, no compose)."""
    return OmegaConf.load(CONF_DIR / "target" / "tiny.yaml").target.tiny

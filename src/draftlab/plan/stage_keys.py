"""The stage registry and the keys that name each stage's folder: what the stage reads, its code, its data.

A stage's folder key is a fingerprint of the config values it reads, the hash of its code
(`draftlab.provenance.code_version`), its inputs' keys and, for generate, the prompt file's content hash. Kept
apart from the pipeline so a stage (generate checks that its pool is its own) can compute its key without
importing the runner, and so nothing here loads torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from draftlab.provenance.code_version import cached_code_version
from draftlab.util.fsutil import remembered
from draftlab.provenance.provenance import file_sha256, fingerprint


@dataclass(frozen=True)
class StageSpec:
    name: str
    reads: tuple[str, ...]  # config keys (or whole sections) that determine the output
    needs: tuple[str, ...] = ()  # upstream stages, in order
    grows_with: tuple[str, ...] = ()  # keys an incremental pool serves from the same folder
    # keys that join the folder key only when set (not 0, None or empty): a setting added later keeps the
    # folders made without it, as SERVER_LAUNCH_READS do
    when_set: tuple[str, ...] = ()

    @property
    def incremental(self) -> bool:
        return bool(self.grows_with)


_TARGET = ("target.name", "target.path", "target.gguf_file", "target.dtype", "target.tiny")
_PROMPTS = ("data.source", "data.path", "data.seed", "data.val_fraction", "data.max_prompt_tokens")
_FIXED_VAL = ("data.val_samples",)  # a fixed validation set made first: another pool order, another pool
_CONTRACT = ("serve.sglang_version",)

STAGES: dict[str, StageSpec] = {
    "generate": StageSpec("generate", _TARGET + _PROMPTS + (
        "data.max_new_tokens", "data.temperature", "data.batch_size", "data.generator", "data.compile_decode",
        "data.engine"),
        grows_with=("data.samples",), when_set=_FIXED_VAL),
    # allow_unlisted_arch picks the capture rule of a class missing from SGLang's contract, and sglang_version
    # whose contract applies: which layers are read (online training reads them too)
    "extract": StageSpec("extract", _TARGET + ("target.allow_unlisted_arch", "extract.layers", "extract.dtype",
                                               "extract.mode"),
                         needs=("generate",), grows_with=("data.samples", "draft.vocab_size"),
                         when_set=_FIXED_VAL + _CONTRACT),
    # serve.dtype and serve.sglang_rules: how train.bench_every serves the draft it benches (train/bench_tau.py)
    "train": StageSpec("train", ("data.samples", "extract.mode", "draft", "train", "serve.num_steps"),
                       needs=("generate", "extract"),
                       when_set=_FIXED_VAL + _CONTRACT + ("serve.dtype", "serve.sglang_rules")),
    # bench reads data.samples to pick the same held-out prompts whatever else the shared pool holds; the
    # prompts themselves come from generate's samples, whose key is one of bench's inputs.
    # data.max_prompt_tokens: which prompts of a bench set fit once templated
    "bench": StageSpec("bench", _TARGET + ("data.samples", "data.max_prompt_tokens", "serve", "bench"),
                       needs=("generate", "train"),
                       when_set=_FIXED_VAL),
}
# Settings that change how fast, where, or how files are cut, not what they hold: they never split a cache, and
# a sweep's analysis never compares runs on them (`fingerprinted`). tests/integration/test_stage_reads.py checks that
# every key a stage reads is in its reads or here.
NOT_FINGERPRINTED = {"train.log_every", "train.device", "train.strategy", "serve.host", "serve.port", "serve.python",
                     "serve.env",
                     # the same loss and gradients, compiled or not (tests/unit/test_compiled_loss.py,
                     # tests/unit/test_compiled_unroll.py): speed settings
                     "train.compile_loss", "train.compile_unroll", "train.compile_cpp_wrapper",
                     "train.compile_cuda_graphs", "train.graph_count_bucket", "train.compile_warmup",
                     "target.device", "target.device_map",
                     "data.shard_size", "extract.batch_size", "extract.shard_size", "extract.writers",
                     # where the pool lives (memory or disk), not what it holds
                     "extract.pool_root",
                     # a resumed run ends bit-identical wherever it was checkpointed (tests/unit/test_train_loop.py)
                     "train.checkpoint_every",
                     # how long to wait for a server to start, not what it serves
                     "serve.startup_timeout_s",
                     # where data.engine=server finds the target, not which model it is (target.* names that)
                     "data.server"}
# Read by every stage, never part of a key: where outputs go and how they are tracked.
NOT_OUTPUT_SETTINGS = ("paths", "tracking", "stages")


def _covers(section: str, key: str) -> bool:
    return key == section or key.startswith(section + ".")


def read_by(key: str, stages) -> bool:
    """True when one of the named stages reads the dotted config key (into its folder key, grown or when set)."""
    return any(_covers(read, key) for name in stages if name in STAGES
               for read in STAGES[name].reads + STAGES[name].grows_with + STAGES[name].when_set)


def fingerprinted(key: str) -> bool:
    """True when the dotted config key is part of some stage's folder key, i.e. it can change what a stage
    produces. Everything else (NOT_FINGERPRINTED, NOT_OUTPUT_SETTINGS, keys no stage reads such as
    `hardware.name`) only changes how fast, where or how it is tracked: the one list the analysis uses too."""
    if any(_covers(skip, key) for skip in NOT_FINGERPRINTED):
        return False
    return read_by(key, STAGES)


# When generate starts SGLang itself (data.engine=server, no data.server.url), the serve.* launch settings that can
# change its answers: the dtype, the tensor-parallel split (another reduction order) and free-form flags (a
# --quantization, say). Only then are they part of the pool's key, so that other configs keep their pools.
SERVER_LAUNCH_READS = ("serve.dtype", "serve.tp_size", "serve.extra_args")


def _starts_its_own_server(cfg) -> bool:
    return cfg.data.engine == "server" and not cfg.data.server.url


@dataclass
class PlannedStage:
    spec: StageSpec
    folder: Path
    folder_key: str  # what the folder holds: the stage's settings, code, data and its inputs' folders
    key: str  # full key: folder key + grows_with values + inputs' full keys
    # the stage's code hash (draftlab.provenance.code_version): runs compared in one analysis must share it
    code: str = ""

    @property
    def done_record(self) -> Path:
        return self.folder / ".done" / f"{self.key[:16]}.json"


def _values(cfg, keys: tuple[str, ...]) -> dict:
    values = {}
    for key in keys:
        node = OmegaConf.select(cfg, key, throw_on_missing=True)
        values[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        if isinstance(values[key], dict):
            values[key] = {k: v for k, v in values[key].items() if f"{key}.{k}" not in NOT_FINGERPRINTED}
    return values


def prompt_file(data) -> Path:
    """The file the prompts come from: `data.path`, or the embedded ShareGPT file."""
    if data.path:
        return Path(data.path)
    from draftlab.data.prompts import embedded_sharegpt

    return embedded_sharegpt()


def content_sha256(path: Path, cache_dir: Path) -> str:
    """sha256 of a file's bytes, remembered in `cache_dir` by (path, size, mtime) so that an all-cached rerun
    does not read 125 MB of ShareGPT again. An edit in place changes size or mtime, so it is hashed afresh."""
    path = Path(path).resolve()
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"data.path: {path} does not exist") from None
    stamp = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    return remembered(Path(cache_dir) / "file_sha256.json", stamp, f"{path}|", lambda: file_sha256(path))


def _stage_root(cfg, name: str) -> Path:
    """paths.root, or extract.pool_root for the feature pool (the GPU preset keeps it in memory: BENCHMARKS.md
    "Defaults measured on the GPU").
    Under pool_root each paths.root has a folder of its own: a pool in /dev/shm outlives a deleted paths.root, and
    must never be extended with the samples of another root's generate pool."""
    if name == "extract" and cfg.extract.pool_root:
        return Path(cfg.extract.pool_root) / f"root-{fingerprint(str(Path(cfg.paths.root).resolve()))[:12]}"
    return Path(cfg.paths.root)


def plan(cfg, package_root: Path | None = None, upto: str | None = None) -> dict[str, PlannedStage]:
    """Folders and keys of every stage for this config, or of the stages up to `upto` (cheap: reads source files,
    never a stage output)."""
    root = Path(cfg.paths.root)
    data_sha = content_sha256(prompt_file(cfg.data), root / ".cache")
    planned: dict[str, PlannedStage] = {}
    for name, spec in STAGES.items():
        upstream = {up: (planned[up].folder.name if STAGES[up].incremental else planned[up].key) for up in spec.needs}
        upstream_full = {up: planned[up].key for up in spec.needs}
        reads = {"stage": name, "reads": _values(cfg, spec.reads), "inputs": upstream,
                 "code": cached_code_version(name, root / ".cache", package_root)}
        if "data.path" in spec.reads:
            reads["data.sha256"] = data_sha
        chosen = {k: v for k, v in _values(cfg, spec.when_set).items() if v}
        if chosen:
            reads["when_set"] = chosen
        if name == "bench" and bench_files(cfg):
            reads["bench.sets.sha256"] = [content_sha256(f, root / ".cache") for f in bench_files(cfg)]
        if name == "generate" and _starts_its_own_server(cfg):
            reads["server_launch"] = _values(cfg, SERVER_LAUNCH_READS)
        folder_key = fingerprint(reads)
        full_key = fingerprint({"folder": folder_key, "grows": _values(cfg, spec.grows_with), "inputs": upstream_full})
        planned[name] = PlannedStage(spec, _stage_root(cfg, name) / name / folder_key[:16], folder_key[:16], full_key,
                                     reads["code"])
        if name == upto:
            break
    return planned


def bench_files(cfg) -> list[Path]:
    """The prompt files of bench.sets: an edit in place must not leave the bench stage cached."""
    from draftlab.data.bench_sets import set_files

    return set_files(list(cfg.bench.sets))


def data_sha256(cfg) -> str:
    """The prompt file's content hash as the keys see it."""
    return content_sha256(prompt_file(cfg.data), Path(cfg.paths.root) / ".cache")


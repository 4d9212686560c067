"""Every check that needs no model weights, run before any stage and before the MLflow run opens.

Bad input must fail in one line naming the key, file or line, not after generate, extract and train have run:
paths.root, the target's path and shape, the layer ids and vocabulary against that shape, the generation server,
the prompt file (readable, UTF-8, valid), enough prompts for `data.samples` and a split that leaves both training
and validation prompts. Each failure is a ConfigError whose message starts with the config key.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from draftlab.config.config import ConfigError
from draftlab.data.pool import pool_size

log = logging.getLogger("draftlab")

HUB_NAME_HINT = "a Hugging Face model folder, or a hub name such as org/model"


def preflight(cfg) -> None:
    check_paths_root(cfg.paths.root)
    check_target_path(cfg.target)
    check_sglang_version(cfg)
    check_target_shape(cfg)
    check_devices(cfg)
    check_val_fraction(cfg)
    check_bench_sets(cfg)
    check_pool_root(cfg)
    check_sglang_server(cfg)
    if "generate" in cfg.stages and not _pool_holds(cfg):
        check_server(cfg)
        check_prompts(cfg)
        check_bench_set_prompts(cfg, count_tokens=True)
    else:
        check_bench_set_prompts(cfg, count_tokens=False)  # a cached pool: no tokenizer (no torch) in preflight


def check_paths_root(raw) -> Path | None:
    """paths.root is a folder draftlab can write. It is made when its parent exists (the default `outputs` under
    the project, or a new folder beside existing ones) and the console says so; a missing parent is refused, so
    that a typo never grows a second tree of outputs. Returns the folder it made, if any."""
    import os
    import tempfile

    root = Path(str(raw)).expanduser()
    made = None
    if not root.exists():
        parent = root.absolute().parent
        if not parent.is_dir():
            raise ConfigError(f"paths.root: {raw}: its parent folder {parent} does not exist (a typo?); create it "
                              "first, or point paths.root at an existing folder")
        try:
            root.mkdir()
            made = root.absolute()
            log.info("paths.root: made the folder %s", made)
        except FileExistsError:  # another job of the same sweep made it first
            pass
        except OSError as err:
            raise ConfigError(f"paths.root: cannot make {raw} ({err.strerror or err})") from None
    elif not root.is_dir():
        raise ConfigError(f"paths.root: {raw} is a file, not a folder")
    try:  # os.access says yes to root on read-only mounts and /proc: write a file to know
        handle, probe = tempfile.mkstemp(dir=root, prefix=".draftlab-write-check-")
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(f"paths.root: {raw} is not writable ({err.strerror or err})") from None
    return made


def check_target_path(target) -> None:
    """target.path is used (target=hf, and it exists when it names a folder) or refused."""
    if target.name != "hf":
        for key in ("path", "gguf_file"):
            if target[key]:
                raise ConfigError(f"target.{key}: {target[key]} is not used by target={target.name}; "
                                  f"for your own model use target=hf target.{key}=...")
        return
    raw = str(target.path)
    path = Path(raw).expanduser()
    # A hub name is `org/model` (or a bare name); anything else that is not on disk is a missing folder.
    looks_local = path.is_absolute() or raw.startswith((".", "~")) or raw.count("/") > 1
    if looks_local and not path.exists():
        raise ConfigError(f"target.path: {raw} does not exist ({HUB_NAME_HINT})")
    if path.is_dir():
        if target.gguf_file and not (path / target.gguf_file).exists():
            raise ConfigError(f"target.gguf_file: {target.gguf_file} does not exist in {raw}")
        if not target.gguf_file and not (path / "config.json").exists():
            raise ConfigError(f"target.path: {raw} has no config.json (not a Hugging Face model folder)")
    elif path.exists():
        raise ConfigError(f"target.path: {raw} is a file; give its folder (and target.gguf_file for a GGUF)")


def check_sglang_version(cfg) -> None:
    """serve.sglang_version must name a shipped capture contract, whatever the target (a tiny one reads none)."""
    from draftlab.sglang.capture import resolve_version

    resolve_version(cfg.serve.sglang_version)


def check_target_shape(cfg) -> None:
    """Layer ids and the draft vocabulary against the target's shape, read from its config alone."""
    from draftlab.data.layers import resolve_layers, target_capture
    from draftlab.target.target_shape import target_shape

    try:
        shape = target_shape(cfg.target)
    except (OSError, ValueError) as err:  # transformers: hub name not found, unreadable config, ...
        raise ConfigError(f"target.path: cannot read the config of {cfg.target.path}: "
                          f"{str(err).strip().splitlines()[0]}") from err
    # raises ConfigError naming extract.layers, or the target's class when SGLang cannot feed it a draft
    resolve_layers(cfg.extract.layers, shape["num_hidden_layers"],
                   target_capture(cfg.target, cfg.serve.sglang_version))
    if cfg.draft.vocab_size > shape["vocab_size"]:
        raise ConfigError(f"draft.vocab_size: {cfg.draft.vocab_size} is larger than the target vocabulary "
                          f"({shape['vocab_size']})")
    width = cfg.draft.hidden_size
    if cfg.train.freeze_lm_head and width is not None and int(width) != shape["hidden_size"]:
        raise ConfigError(f"train.freeze_lm_head: the draft head is frozen at the target head's rows, which needs "
                          f"draft.hidden_size equal to the target's ({shape['hidden_size']}; it is {width})")


def check_devices(cfg) -> None:
    """A device the stages will use exists: a CUDA device asked for on a machine without one is refused here,
    not by an assertion deep inside torch once generate has run."""
    stages = set(cfg.stages)
    local = {"extract"} | ({"generate"} if cfg.data.engine != "server" else set()) | \
        ({"bench"} if cfg.serve.backend in ("local", "both") else set())
    wanted = {key: str(value) for key, value, used in (("target.device", cfg.target.device, local & stages),
                                                        ("train.device", cfg.train.device, "train" in stages))
              if used and value != "auto" and not (key == "target.device" and cfg.target.device_map)}
    if not wanted or all(value == "cpu" for value in wanted.values()):
        return
    import torch

    for key, value in wanted.items():
        try:
            device = torch.device(value)
        except RuntimeError:
            raise ConfigError(f"{key}: {value!r} is not a device (auto, cpu, cuda, cuda:1, ...)") from None
        if device.type != "cuda":
            continue
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            seen = f"{count} CUDA device(s)" if count else "no CUDA device"
            raise ConfigError(f"{key}: {value}, but torch sees {seen} here; use {key}=auto or cpu")


def check_bench_sets(cfg) -> None:
    """Every bench.sets entry is a built-in set or a prompt file that exists (no file is read yet)."""
    from draftlab.data.bench_sets import parse_sets

    try:
        parse_sets(list(cfg.bench.sets))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_bench_set_prompts(cfg, count_tokens: bool) -> None:
    """When bench runs, every set but the held-out one (check_prompts counts that) reads and holds bench.prompts
    prompts within data.max_prompt_tokens, so that a bad set is refused before generate, extract and train run."""
    from draftlab.data.bench_sets import HELD_OUT, parse_sets, set_texts

    if "bench" not in cfg.stages or _bench_done(cfg):
        return
    sets = parse_sets(list(cfg.bench.sets))
    for bench_set in (s for s in sets if s.kind != HELD_OUT):
        where = bench_set.path or bench_set.name
        try:
            texts = set_texts(bench_set, cfg.bench.seed)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"bench.sets: {where}: {str(err).strip().splitlines()[0]}") from None
        usable, exact = _usable_bench_prompts(cfg, texts) if count_tokens else (texts, False)
        if len(usable) < cfg.bench.prompts:
            within = f" within data.max_prompt_tokens={cfg.data.max_prompt_tokens}" if exact else ""
            raise ConfigError(f"bench.sets: {where} has {len(usable)} usable prompts{within}, and bench.prompts="
                              f"{cfg.bench.prompts} asks for that many from each set; lower bench.prompts or add "
                              "prompts")


def _bench_done(cfg) -> bool:
    """The bench stage's completion record exists: a cached job reads no prompt set (and imports no torch)."""
    from draftlab.plan.stage_keys import plan

    try:
        return plan(cfg)["bench"].done_record.exists()
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _usable_bench_prompts(cfg, texts: list[str]) -> tuple[list, bool]:
    """The bench stage's first bench.prompts prompts of a set within data.max_prompt_tokens, counted with the
    tokenizer when it loads cheaply (else every prompt counts, and the stage refuses the rest)."""
    from draftlab.data.prompts import Prompt
    from draftlab.target.target import load_tokenizer, usable_prompts

    tokenizer = load_tokenizer(cfg.target, Path(cfg.paths.root) / "models")
    if tokenizer is None:
        return list(texts), False
    prompts = [Prompt(t, str(i)) for i, t in enumerate(texts)]
    return usable_prompts(tokenizer, prompts, cfg.data.max_prompt_tokens, cfg.bench.prompts), True


def check_val_fraction(cfg) -> None:
    if cfg.data.val_fraction <= 0 and ({"train", "bench"} & set(cfg.stages)):
        raise ConfigError(f"data.val_fraction: {cfg.data.val_fraction} leaves no validation prompts; val/loss and "
                          f"bench (bench.prompts={cfg.bench.prompts}) need some, e.g. data.val_fraction=0.125")


def check_pool_root(cfg) -> None:
    """extract.pool_root (the GPU preset's /dev/shm) can hold a pool: a folder that can be made and written.
    Whether the pool fits is known only once generate has counted the tokens (the extract stage checks it)."""
    if not cfg.extract.pool_root or "extract" not in cfg.stages:
        return
    import os

    folder = Path(cfg.extract.pool_root)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"extract.pool_root: cannot make {folder} ({err.strerror}); point it at a writable "
                          f"folder, or extract.pool_root=null keeps the pool under paths.root") from None
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"extract.pool_root: {folder} is not writable; point it at a writable folder, or "
                          f"extract.pool_root=null keeps the pool under paths.root")


def check_sglang_server(cfg) -> None:
    """A bench that will launch SGLang finds it now, not after generate, extract and train have run."""
    if "bench" not in cfg.stages or cfg.serve.backend not in ("sglang", "both"):
        return
    from draftlab.sglang.server_python import ServerPythonError, server_sglang

    try:
        origin, version = server_sglang(cfg.serve)
    except ServerPythonError as err:
        raise ConfigError(str(err)) from None
    log.info("preflight: the SGLang server will run sglang %s from %s", version, origin)
    check_serving_contract(cfg, version, origin)


def check_serving_contract(cfg, version: str, origin: str) -> None:
    """The features are read with serve.sglang_version's capture contract: the release the server runs must be
    that one, or the draft would be fed other layers than it was trained on."""
    from draftlab.sglang.capture import resolve_version, shipped_versions

    contract = resolve_version(cfg.serve.sglang_version)
    if version == contract:
        return
    fix = (f"set serve.sglang_version={version}" if version in shipped_versions()
           else f"no capture contract ships for {version} (shipped: {', '.join(shipped_versions())})")
    raise ConfigError(f"serve.sglang_version: the server will run sglang {version} ({origin}), but the layers are "
                      f"read with SGLang {contract}'s capture contract; {fix}")


def check_server(cfg) -> None:
    """A data.server.url where nothing listens is refused after one connection attempt, not after the target's
    tokenizer, the tracking run and the retries meant for a server that answered once."""
    if cfg.data.engine != "server" or not cfg.data.server.url:
        return
    from draftlab.serve.remote import ServerError, probe

    try:
        probe(str(cfg.data.server.url))
    except ServerError as err:
        raise ConfigError(str(err)) from None


def _pool_holds(cfg) -> bool:
    """The generate pool already holds data.samples samples: its prompts were checked when it was made."""
    from draftlab.plan.stage_keys import plan

    try:  # planning hashes the prompt file: a missing one is check_prompts' to report
        manifest = plan(cfg)["generate"].folder / "manifest.json"
        return json.loads(manifest.read_text())["num_samples"] >= pool_size(cfg.data)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def check_prompts(cfg) -> None:
    """The prompt file parses, and its first data.samples usable prompts hold both splits.

    Usable means within data.max_prompt_tokens once chat-templated. That needs the tokenizer, loaded alone
    when it is cheap; otherwise the count is conservative (every prompt counts) and generate refuses the rest.
    """
    from draftlab.data.bench_sets import HELD_OUT
    from draftlab.data.prompts import load_prompts

    data = cfg.data
    try:
        prompts = load_prompts(data.source, data.path, data.seed)
    except (OSError, ValueError) as err:
        key = "data.path" if data.path else "data.source"
        raise ConfigError(f"{key}: {str(err).splitlines()[0]}") from err
    chosen, exact = _first_usable(cfg, prompts.prompts)
    within = f" within data.max_prompt_tokens={data.max_prompt_tokens}" if exact else ""
    held_out = sum(prompts.split_of(p, data.val_fraction) == "val" for p in chosen)
    if data.val_samples and held_out < data.val_samples:  # the fixed validation set comes first: name its key
        raise ConfigError(f"data.val_samples: {data.val_samples} asked, but {prompts.source} has only {held_out} "
                          f"held-out prompts (data.val_fraction={data.val_fraction}){within}")
    if len(chosen) < pool_size(data):
        raise ConfigError(f"data.samples: {data.samples} asked, but {prompts.source} has only {len(chosen)} "
                          f"unique prompts{within}")
    splits = [prompts.split_of(p, data.val_fraction) for p in chosen]
    if "val" not in splits and {"train", "bench"} & set(cfg.stages):
        raise ConfigError(f"data.val_fraction: {data.val_fraction} puts none of the first data.samples="
                          f"{data.samples} prompts in validation; raise data.val_fraction or data.samples")
    if "train" not in splits and "train" in cfg.stages:
        raise ConfigError(f"data.val_fraction: {data.val_fraction} leaves none of the first data.samples="
                          f"{data.samples} prompts for training")
    if "bench" in cfg.stages and HELD_OUT in list(cfg.bench.sets) and splits.count("val") < cfg.bench.prompts:
        raise ConfigError(f"bench.prompts: {cfg.bench.prompts}, but only {splits.count('val')} of the first "
                          f"data.samples={data.samples} prompts are held out for the {HELD_OUT} set; lower "
                          "bench.prompts, or raise data.samples or data.val_fraction")


def _first_usable(cfg, prompts: list) -> tuple[list, bool]:
    """The first data.samples prompts generate would answer, and whether their lengths were checked."""
    from draftlab.data.prompts import pool_order, usable_pool
    from draftlab.target.target import load_tokenizer

    data = cfg.data
    tokenizer = load_tokenizer(cfg.target, Path(cfg.paths.root) / "models")
    if tokenizer is None:
        return pool_order(prompts, data.val_fraction, data.val_samples)[:pool_size(data)], False
    chosen = [p for p, _ in usable_pool(tokenizer, prompts, data, pool_size(data))]
    return chosen, True

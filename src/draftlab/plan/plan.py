"""`python -m draftlab plan [--gpus N] [--answer-tokens N] [overrides]`: what a run will take, from the target's
config.json alone (no weights), before anything runs.

It says which target layers SGLang captures for the draft and how wide the features are, what the feature pool
takes on disk (and whether it fits where it would be written: if not, `extract.mode=online`), the draft's
parameters, training memory per GPU for `train.strategy` on N GPUs (`--gpus`, else WORLD_SIZE, else 1) and the
SGLang flags that serve the draft. The overrides are src/run.py's, e.g.
`python -m draftlab plan target=hf target.path=tests/data/kimi-k2.5 data.samples=10000 data.max_new_tokens=2048`.
Every src/run.py job logs the same lines at its start (`log_plan`) and refuses to start when the pool cannot fit
(`check_fits`). The arithmetic is draftlab.plan.plan_estimates.

Tokens per sample: measured from the generate stage's pool when it has one; otherwise the mean chat-templated
prompt length of the first prompts (counted with the target's tokenizer when it is at hand, else about 4 characters
a token) plus `data.max_new_tokens`, the answers' cap (a reasoning model's answers mostly reach it). `--answer-tokens`
replaces the cap with an expected answer length.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from draftlab.util.cli_parser import ArgumentParser
from draftlab.config.config import ConfigError
from draftlab.data import room
from draftlab.plan.plan_estimates import Memory, Params, Storage, draft_params, draft_shape, human, train_memory

log = logging.getLogger("draftlab.plan")
PROMPT_SAMPLE = 2048  # prompts whose lengths are averaged (all of them only when data.samples is smaller)
CHARS_PER_TOKEN = 4.0  # English text in a BPE vocabulary of 100k+ ids, when the tokenizer is not at hand
TEMPLATE_TOKENS = 24  # a chat template's role markers and default system line, likewise
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "tiktoken.model")



@dataclass
class Plan:
    arch: str
    text: dict  # the language model's config (a wrapper's text_config merged over it)
    describe: str  # the capture contract in words
    ids: list[int]
    points: list[int]
    storage: Storage
    tokens_how: str
    done_samples: int  # already in the extract pool
    place: Path  # the nearest existing folder where the pool would be written
    place_key: str
    free: int
    in_memory: bool
    need: int
    params: Params
    memory: Memory
    sglang: str
    offline: bool
    extracts: bool  # the extract stage is in cfg.stages
    steps: int  # train.ttt_steps
    strategy: str  # train.strategy

    @property
    def fits(self) -> bool:
        return not (self.offline and self.extracts) or self.need <= self.free

    def lines(self) -> list[str]:
        s, p, m, t = self.storage, self.params, self.memory, self.text
        unit = s.feature_width // len(self.ids)
        where = "memory (tmpfs)" if self.in_memory else "disk"
        lines = [
            f"target: {self.arch}, {t['num_hidden_layers']} layers, hidden {t['hidden_size']:,}, "
            f"vocab {t['vocab_size']:,}",
            f"capture: ids {self.ids} -> capture points {self.points}; {self.describe}",
            f"features: {len(self.ids)} x {unit:,} = {s.feature_width:,} wide, last hidden state {s.hidden:,} wide",
            f"stored per token: {s.bytes_per_token:,} bytes ({s.feature_width:,} + {s.hidden:,} values in "
            f"{s.dtype}, ids 9)",
            f"tokens: {s.samples:,} samples x {s.tokens_per_sample:,.0f} tokens = "
            + (f"{s.tokens / 1e6:,.1f} M" if s.tokens >= 1e6 else f"{s.tokens:,.0f}") + f" ({self.tokens_how})",
            f"feature storage: {human(s.feature_bytes)} for {s.samples:,} samples of about "
            f"{s.tokens_per_sample:,.0f} tokens in {s.dtype} (the features alone); the pool as extract stores it "
            f"(+ last hidden state and ids): {human(s.pool_bytes)}",
        ]
        if not self.offline:
            lines.append("room: extract.mode=online stores no features (training runs the target)")
        else:
            verdict = "fits" if self.need <= self.free else "DOES NOT FIT: use extract.mode=online (training runs " \
                "the target, nothing stored), lower data.samples, or point " + self.place_key + " at a larger place"
            done = f", {self.done_samples:,} samples already extracted" if self.done_samples else ""
            lines.append(f"room: needs {human(self.need)} in {self.place} ({self.place_key}, {where}, "
                         f"{human(self.free)} free{done}): {verdict}")
        frozen = (f"; embedding {p.embedding:,} frozen, copied from the target" if p.embedding_frozen
                  else "; embedding trained (draft width differs from the target's)")
        frozen += "; head frozen (train.freeze_lm_head)" if p.head_frozen else ""
        lines.append(f"draft: {p.total:,} parameters ({p.trained:,} trained{frozen})")
        gpus = f"{m.gpus} GPU" + ("s" if m.gpus > 1 else "")
        parts = ", ".join(f"{name} {human(size)}" for name, size in m.parts.items() if size)
        how = {"single": "one process", "ddp": "ddp", "fsdp": "fsdp"}[m.strategy]
        lines.append(f"training memory per GPU: about {human(m.total)} (train.strategy={self.strategy}: {how} on "
                     f"{gpus}, {m.tokens:,} tokens a GPU x {self.steps} TTT steps): {parts}")
        lines.append(f"sglang: {self.sglang}")
        return lines



def build(cfg, gpus: int | None = None, answer_tokens: int | None = None) -> Plan:
    """The plan of a validated config; ConfigError naming the key when the target cannot feed a draft."""
    from draftlab.data.layers import capture_points, resolve_layers
    from draftlab.sglang.capture import for_target
    from draftlab.target.target_shape import text_config

    config = target_config(cfg.target)
    text = text_config(config)
    capture = for_target(config, allow_unlisted=bool(cfg.target.get("allow_unlisted_arch", False)),
                         version=cfg.serve.sglang_version)
    L = int(text["num_hidden_layers"])
    ids = resolve_layers(cfg.extract.layers, L, capture)
    points = capture_points(cfg.extract.layers, ids, L, capture)
    shape = draft_shape(text, cfg.draft, ids, min(int(cfg.draft.vocab_size), text["vocab_size"]),
                        cfg.train.max_seq_len)
    params = draft_params(shape, bool(cfg.train.freeze_lm_head))
    per_sample, how = tokens_per_sample(cfg, answer_tokens)
    storage = Storage(cfg.extract.dtype, len(ids) * text["hidden_size"], text["hidden_size"], int(cfg.data.samples),
                      per_sample)
    done = extracted_samples(cfg)
    left = max(0, storage.samples - done)
    place, key = pool_place(cfg)
    free, in_memory = room.free_bytes(place)
    need = room.room_needed(int(left * per_sample), left, storage.bytes_per_token, in_memory,
                            cfg.extract.shard_size, cfg.extract.writers) if left else 0
    gpus = gpus or int(os.environ.get("WORLD_SIZE", "1"))
    memory = train_memory(shape, params, batch_tokens=cfg.train.batch_tokens, max_seq_len=cfg.train.max_seq_len,
                          ttt_steps=cfg.train.ttt_steps, strategy=cfg.train.strategy, gpus=gpus,
                          amp=cfg.train.dtype in ("auto", "bfloat16"), pool_dtype=cfg.extract.dtype)
    arch = capture.arch + (f" (text model {text.get('model_type')} from text_config)"
                           if isinstance(config.get("text_config"), dict) else "")
    return Plan(arch=arch, text=text, describe=capture.describe(), ids=ids, points=points, storage=storage,
                tokens_how=how, done_samples=min(done, storage.samples), place=place, place_key=key, free=free,
                in_memory=in_memory, need=need, params=params, memory=memory, sglang=sglang_command(cfg),
                offline=cfg.extract.mode == "offline", extracts="extract" in cfg.stages, steps=cfg.train.ttt_steps,
                strategy=cfg.train.strategy)


def plan_lines(cfg, gpus: int | None = None, answer_tokens: int | None = None) -> list[str]:
    return build(cfg, gpus, answer_tokens).lines()


def check_fits(cfg, plan: Plan | None = None) -> None:
    """ConfigError, naming where the pool goes, when an offline extraction of data.samples cannot fit there."""
    plan = plan or build(cfg)
    if plan.fits:
        return
    s = plan.storage
    raise ConfigError(
        f"{plan.place_key}: extract.mode=offline with data.samples={s.samples:,} needs about {human(plan.need)} "
        f"({s.tokens_per_sample:,.0f} tokens a sample x {s.bytes_per_token:,} bytes a token) and {plan.place} has "
        f"{human(plan.free)} free; set extract.mode=online (nothing stored), lower data.samples, or point "
        f"{plan.place_key} at a larger place")


def log_plan(cfg) -> None:
    """At the start of a src/run.py job: the plan in the log, and the job refused when the pool cannot fit."""
    try:
        plan = build(cfg)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - the plan informs: a target it cannot size must not stop the job
        log.warning("plan: not made (%s: %s)", type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        return
    for line in plan.lines():
        log.info("plan: %s", line)
    check_fits(cfg, plan)


# ------------------------------------------------------------------------------------------------ inputs
def target_config(target_cfg) -> dict:
    """The target's config.json as a dict, read without weights; an unreadable one names target.path."""
    from draftlab.target.target_shape import target_config_json

    try:
        return target_config_json(target_cfg)
    except ConfigError:
        raise  # already names target.path and what is wrong
    except (OSError, ValueError) as err:
        raise ConfigError(f"target.path: cannot read the config of {target_cfg.path}: "
                          f"{str(err).strip().splitlines()[0]}") from err


def _stage_manifest(cfg, stage: str) -> dict | None:
    """A stage pool's manifest, when paths.root exists (planning keys under a fresh root would write its cache)."""
    if not Path(cfg.paths.root).exists():
        return None
    from draftlab.plan.stage_keys import plan

    try:
        return json.loads((plan(cfg)[stage].folder / "manifest.json").read_text())
    except (OSError, ValueError, KeyError):
        return None


def extracted_samples(cfg) -> int:
    manifest = _stage_manifest(cfg, "extract")
    return int(manifest.get("num_samples", 0)) if manifest and manifest.get("mode") == "offline" else 0


def tokens_per_sample(cfg, answer_tokens: int | None = None) -> tuple[float, str]:
    """(mean tokens a sample, how it was found): see the module docstring."""
    generated = _stage_manifest(cfg, "generate")
    if answer_tokens is None and generated and generated.get("num_samples"):
        n = generated["num_samples"]
        return generated["tokens"] / n, f"measured over the {n:,} generated samples"
    prompt, how = prompt_tokens(cfg)
    if answer_tokens is not None:
        return prompt + answer_tokens, f"prompt ~{prompt:,.0f} {how} + answer {answer_tokens:,} (--answer-tokens)"
    answer = cfg.data.max_new_tokens
    return prompt + answer, f"prompt ~{prompt:,.0f} {how} + answer {answer:,} (data.max_new_tokens, the cap)"


def prompt_tokens(cfg) -> tuple[float, str]:
    """Mean chat-templated prompt length of the first usable prompts."""
    from draftlab.data.prompts import load_prompts

    data = cfg.data
    try:
        prompts = load_prompts(data.source, data.path, data.seed).prompts
    except (OSError, ValueError):
        return data.max_prompt_tokens / 2, "(half data.max_prompt_tokens: no prompt file to read)"
    count = min(int(data.samples), PROMPT_SAMPLE)
    tokenizer = _cheap_tokenizer(cfg)
    if tokenizer is not None:
        from draftlab.target.target import usable_prompts

        lengths = [len(ids) for _, ids in usable_prompts(tokenizer, prompts, data.max_prompt_tokens, count)]
        how = "counted with the target's tokenizer"
    else:
        guesses = (len(p.text) / CHARS_PER_TOKEN + TEMPLATE_TOKENS for p in prompts)
        lengths = [g for g in guesses if g <= data.max_prompt_tokens][:count]
        how = f"estimated at {CHARS_PER_TOKEN:.0f} characters a token"
    if not lengths:
        return float(data.max_prompt_tokens), "(no usable prompt: data.max_prompt_tokens)"
    return sum(lengths) / len(lengths), f"{how} over {len(lengths):,} prompts"


def _cheap_tokenizer(cfg):
    """The target's tokenizer when it needs no download and no conversion (draftlab.target.target.load_tokenizer)."""
    target = cfg.target
    if target.name == "hf":
        folder = Path(str(target.path)).expanduser()
        if target.gguf_file or not any((folder / name).exists() for name in TOKENIZER_FILES):
            return None
    from draftlab.target.target import load_tokenizer

    try:
        return load_tokenizer(target, Path(cfg.paths.root) / "models")
    except (OSError, ValueError, ImportError):
        return None


def pool_place(cfg) -> tuple[Path, str]:
    """(the nearest existing folder of where the extract pool goes, the key that puts it there)."""
    key = "extract.pool_root" if cfg.extract.pool_root else "paths.root"
    place = Path(str(cfg.extract.pool_root or cfg.paths.root)).expanduser().absolute()
    while not place.exists() and place != place.parent:
        place = place.parent
    return place, key


def sglang_command(cfg) -> str:
    """The SGLang server command for this target and a draft folder (sglang/launch.py builds every flag)."""
    from draftlab.sglang.launch import LaunchError, build_server_argv

    if cfg.target.name == "tiny":
        return "target=tiny exists only in code: no SGLang server can load it"
    target = cfg.target.path if cfg.target.name == "hf" else "<the converted SmolLM2 folder under paths.root/models>"
    try:
        command = shlex.join(build_server_argv(cfg.serve, target, "<draft folder>"))
    except LaunchError as err:
        return f"cannot build the command: {err}"
    return command + grid_best(cfg)


def grid_best(cfg) -> str:
    """The best serving setting this config's bench measured in SGLang (bench.sglang_grid), when one did."""
    from draftlab.sglang.grid import launch_flags

    metrics = (_stage_manifest(cfg, "bench") or {}).get("metrics") or {}
    best = "bench/sglang/grid_best"
    if f"{best}/steps" not in metrics:
        return ""
    setting = tuple(int(metrics[f"{best}/{k}"]) for k in ("steps", "topk", "num_draft_tokens"))
    return (f"; the bench's best setting in SGLang: {launch_flags(setting)} (speed-up "
            f"{metrics[f'{best}/speedup']:.3g}x at tau {metrics[f'{best}/tau']:.3g})")


# ------------------------------------------------------------------------------------------------ command line
def compose(overrides: list[str]):
    """The validated config for src/run.py-style overrides."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from draftlab.config.config import compose_conf, validate

    try:
        composed = compose_conf(overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"overrides: {str(err).strip().splitlines()[0]}") from None
    return validate(composed)


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m draftlab plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=None, help="GPUs training runs on (default: WORLD_SIZE or 1)")
    parser.add_argument("--answer-tokens", type=int, default=None,
                        help="expected answer length, tokens (default: data.max_new_tokens)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for src/run.py")
    args = parser.parse_intermixed_args(argv)
    if args.gpus is not None and args.gpus < 1:
        raise ConfigError(f"--gpus: {args.gpus}; at least 1")
    if args.answer_tokens is not None and args.answer_tokens < 1:
        raise ConfigError(f"--answer-tokens: {args.answer_tokens}; at least 1")
    cfg = compose(args.overrides)
    plan = build(cfg, args.gpus, args.answer_tokens)
    print("\n".join(plan.lines()))
    if not plan.fits:
        print(f"recommended: extract.mode=online (the pool does not fit in {plan.place})")
    return 0

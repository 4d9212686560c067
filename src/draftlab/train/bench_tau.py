"""Deployed tau of the draft while it trains (`train.bench_every`): the local engine on a fixed set of prompts.

Loss and predicted tau are teacher-forced; what a user gets is the tau of the deployed chain, which can peak while
loss still falls (a public EAGLE-3 reproduction lost 4.9% of tau after about 4.6 epochs). So every
`train.bench_every` steps the draft's current weights are exported as the train stage exports them, loaded as
SGLang would load them (serve/loader.py), and decoded greedily next to the target on the first
`train.bench_prompts` validation prompts of the job's pool (the bench stage's held-out prompts: never trained on),
`train.bench_max_new_tokens` new tokens each. tau is SGLang's count over all of them: completion tokens over
verify steps. A few short prompts keep each point cheap; the bench stage, on its own prompt sets with intervals,
is the measurement a decision rests on.

The engine runs with dynamic KV caches (no CUDA graphs to capture again for every point), and under
`torch.random.fork_rng`, so that loading a draft (its parameters are initialised before the weights load) leaves
the training run's random state where it was: a run with benches trains as one without.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import torch

from draftlab.sglang.export import export_draft
from draftlab.model.draft import DraftModelConfig, Eagle3Draft

log = logging.getLogger("draftlab")


def held_out_prompts(samples_folder: Path, count: int, limit: int | None) -> list[list[int]]:
    """The prompt ids of the first `count` validation samples among the first `limit`: the bench stage's."""
    from draftlab.data.samples import val_prompts

    prompts = val_prompts(samples_folder, count, limit)
    if not prompts:
        raise ValueError(f"train.bench_every: {samples_folder} holds no validation prompts to bench on")
    return prompts


class TauBench:
    """`bench(model) -> tau`: the draft's deployed tau on the fixed prompts (module docstring)."""

    def __init__(self, target, prompts: list[list[int]], draft_cfg: DraftModelConfig, num_steps: int,
                 max_new_tokens: int, rules: str = "current", dtype: torch.dtype | None = None):
        self.target, self.prompts, self.draft_cfg = target, prompts, draft_cfg
        self.num_steps, self.max_new_tokens, self.rules, self.dtype = num_steps, max_new_tokens, rules, dtype

    def __call__(self, model: Eagle3Draft) -> float:
        from draftlab.serve.engine import SpecEngine
        from draftlab.serve.modes import DYNAMIC, load_drafter

        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices), tempfile.TemporaryDirectory(prefix="bench-tau-") as tmp:
            folder = export_draft(model, self.draft_cfg, Path(tmp) / "draft", "bfloat16")
            drafter, _ = load_drafter(folder, self.target.model, DYNAMIC, self.rules, self.dtype)
            engine = SpecEngine(self.target.model, drafter, self.num_steps, self.target.eos_token_ids)
            tokens = steps = 0
            for ids in self.prompts:
                gen = engine.generate(ids, self.max_new_tokens)
                tokens, steps = tokens + len(gen.tokens), steps + gen.verify_steps
        return tokens / max(steps, 1)


def from_config(cfg, samples_folder: Path, draft_cfg: DraftModelConfig) -> TauBench:
    """The bench of `cfg.train.bench_*` on the job's target and pool, as the bench stage would serve the draft."""
    from draftlab.target.target import load_target

    target = load_target(cfg.target, Path(cfg.paths.root) / "models")
    prompts = held_out_prompts(samples_folder, int(cfg.train.bench_prompts), cfg.data.samples)
    dtype = target.dtype if cfg.serve.dtype == "auto" else getattr(torch, cfg.serve.dtype)
    log.info("train: benching the draft every %d steps on %d validation prompts, %d new tokens each",
             cfg.train.bench_every, len(prompts), cfg.train.bench_max_new_tokens)
    return TauBench(target, prompts, draft_cfg, int(cfg.serve.num_steps), int(cfg.train.bench_max_new_tokens),
                    cfg.serve.sglang_rules, dtype)

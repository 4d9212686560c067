"""The compile warm-up: the compiled unroll's graphs built on a synthetic batch, in processes of their own, while the
job's generate and extract stages run (started and awaited by draftlab/warmup/launch.py).

Compiling the unroll is the first training step's work, 157.5 s cold in the 50,000-sample headline run on the H200,
and all of it sat on the critical path: training cannot start before extract ends. But the graph
depends only on what is known before any data exists: the target's config (width, vocabulary, attention shape),
the feature layers (extract.layers), draft.* and train.*. torch.compile keeps what it built on disk (AOTAutograd's
and Inductor's caches under TORCHINDUCTOR_CACHE_DIR), so when the train stage's first step traces the same graph it
loads it instead of compiling it; `train/compile_cache_hits` says whether it did.

Two graphs, one process each (they build in parallel; the host has cores to spare while generate runs): training's
forward and backward, and validation's forward (train/compiled_unroll.py), stepped by the trainer's own code: a
forward and backward (`Trainer.build_graphs`), and `Trainer.evaluate` on a source of this one batch.

The batch is the reader's layout (data/reader.batch_buffers), in rows of uneven length whose first 40% is prompt
(outside the loss, ShareGPT's share), padded to about half of train.batch_tokens: a real batch's tokens fill 46-69%
of its budget. The cache holds a graph with the guards of the batch it was built on, and a real
batch must pass them: at least two rows and every TTT step with many pairs (a one-row batch, or a step of 0 or 1
pairs, would specialise: train/compiled_unroll.py), and on the CPU no more than 4,096 pairs in all and positions in
the batch (Inductor's CPU code guards these, so a CPU warm-up serves batches of at most about 8,192 tokens, such as
the smoke recipe's 2,048; no such guard was seen on the H200). The draft is built from the target's config (read
without its weights) by the train stage's own `draft_config`.

A warm-up whose job is killed (no `finally` runs) notices that its parent is gone and exits.

    python -m draftlab warm-compile CONFIG.yaml RESULT.json [--validation]    (CONFIG: a job's resolved config)
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from draftlab.util import fsutil
from draftlab.data.reader import batch_buffers
from draftlab.data.layers import resolve_layers
from draftlab.model.draft import Eagle3Draft
from draftlab.stages.train import draft_config
from draftlab.train.loop import LoopSettings, Trainer
from draftlab.warmup.launch import exit_with_parent, target_config

log = logging.getLogger("draftlab")
PROMPT_SHARE = 0.4  # of each synthetic row, outside the loss
ROW_LENGTH = 256  # the longest synthetic row (train.max_seq_len if shorter); rows are [half of it, all of it]


def warm_batch(cfg, hidden: int, vocab: int, layers: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A host batch with a real one's keys, dtypes and masks, and random values (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    T = min(ROW_LENGTH, int(cfg.train.max_seq_len))
    B = max(2, int(cfg.train.batch_tokens) // (2 * T))
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g).tolist()
    lengths[0] = T  # the batch is as long as its longest row, as the reader makes it
    dtype = getattr(torch, cfg.extract.dtype)
    out = batch_buffers(B, T, layers * hidden, hidden, dtype, with_top=True, pin=torch.cuda.is_available())
    out["features"].zero_()
    out["last_hidden"].zero_()
    for i, n in enumerate(lengths):
        out["input_ids"][i, :n] = torch.randint(0, vocab, (n,), generator=g)
        out["target_top"][i, :n] = torch.randint(0, vocab, (n,), generator=g, dtype=torch.int32)
        out["features"][i, :n] = torch.randn(n, layers * hidden, generator=g).to(dtype)
        out["last_hidden"][i, :n] = torch.randn(n, hidden, generator=g).to(dtype)
        out["loss_mask"][i, int(PROMPT_SHARE * n):n] = True
        out["attention_mask"][i, :n] = True
    out["sample_index"] = torch.arange(B)
    return out


def warm_trainer(cfg, folder: Path) -> tuple[Trainer, dict]:
    """The trainer the train stage would build, on a randomly initialised draft of the same shape, and a batch."""
    tc = target_config(cfg.target, Path(cfg.paths.root) / "models")
    layer_ids = resolve_layers(cfg.extract.layers, tc["num_hidden_layers"])
    manifest = {"target": {"config": tc, "hidden_size": tc["hidden_size"]}, "layer_ids": layer_ids}
    dcfg = draft_config(cfg.draft, manifest, int(cfg.draft.vocab_size), int(cfg.train.max_seq_len))
    torch.manual_seed(cfg.train.seed)
    model = Eagle3Draft(dcfg)
    # as train.build_model does (it decides which weights train), from a random head and the target's first ids as
    # the draft vocabulary: only shapes matter to the compiler
    lm_head = torch.randn(tc["vocab_size"], tc["hidden_size"]) * 0.02
    d2t = torch.zeros(dcfg.draft_vocab_size, dtype=torch.int64)
    t2d = torch.zeros(tc["vocab_size"], dtype=torch.bool)
    t2d[: dcfg.draft_vocab_size] = True
    model.init_from_target(lm_head, lm_head, d2t, t2d, freeze_head=bool(cfg.train.freeze_lm_head))
    trainer = Trainer(model, None, lm_head, LoopSettings.from_cfg(cfg), folder / "checkpoints")
    return trainer, warm_batch(cfg, tc["hidden_size"], tc["vocab_size"], len(layer_ids))


class OneBatch:
    """A source whose every split is one batch (what `Trainer.evaluate` reads)."""

    def __init__(self, batch: dict) -> None:
        self.batch = batch

    def batches(self, split, epoch, batch_tokens, max_seq_len, seed, shuffle=True, prepare=None):
        yield prepare(self.batch) if prepare else self.batch


def warm(cfg, validation: bool = False) -> dict[str, float]:
    """Builds the compiled unroll's training graph (and the compiled loss), or its validation graph, into the compile
    cache; returns the unroll's train/compile_* metrics. Raises when the unroll is not compiled here or its compile
    failed."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="draftlab-warmup-") as tmp:
        trainer, batch = warm_trainer(cfg, Path(tmp))
        if trainer.core is None:
            raise RuntimeError(f"train.compile_unroll={cfg.train.compile_unroll} on {trainer.device}: the unroll "
                               "is not compiled, so there is nothing to warm")
        if validation:
            trainer.source = OneBatch(batch)
            trainer.core.validation = True  # the train stage compiles it once training's graph comes from the cache
            trainer.evaluate()
        else:
            trainer.build_graphs(batch)
    failed = trainer.core.failed or (trainer.core.validation_failed if validation else None)
    if failed is not None:
        raise RuntimeError(f"the unroll's compile failed: {failed}") from failed
    return {**trainer.core.metrics(), "warmup_s": round(time.perf_counter() - started, 2)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m draftlab warm-compile", description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path, help="a job's resolved config (YAML)")
    ap.add_argument("result", type=Path, help="where the metrics go (JSON, written when the graph is built)")
    ap.add_argument("--validation", action="store_true", help="validation's graph (forward only), not training's")
    args = ap.parse_args(argv)
    exit_with_parent()
    result = warm(OmegaConf.load(args.config), args.validation)
    fsutil.atomic_write_json(args.result, result)
    log.info("compile warm-up: %s", result)
    return 0

"""Each validation sample's loss, predicted tau and token count under the trainer's weights: the per-sample
results the sweep analysis bootstraps over (analysis/valnoise.py).

One sample at a time through the eager unroll (train/ttt.py), padding trimmed: the packed and compiled paths
sum over a batch, and a few thousand small forwards after training cost seconds, not a graph per shape.
"""

from __future__ import annotations

import contextlib

import torch

from draftlab.model.attention import variable_shape_attention
from draftlab.train.device_batch import widen
from draftlab.train.ttt import summarize, target_distribution, ttt_unroll

FILE = "val_samples.json"


@torch.no_grad()
def per_sample_validation(trainer) -> dict[str, list[float]]:
    """{"index", "loss", "tau", "tokens"}: one entry per validation sample with a counted position, in the
    source's order. `tokens` (positions counted at step 0) weighs a sample as the pass's totals do. `index` is
    the pool's sample index; a source whose batches carry none gives its unshuffled validation order instead."""
    s, model = trainer.s, trainer.model
    out: dict[str, list[float]] = {"index": [], "loss": [], "tau": [], "tokens": []}
    amp = torch.autocast(trainer.device.type, dtype=trainer.amp) if trainer.amp else contextlib.nullcontext()
    model.eval()
    seen = 0
    try:
        for batch in trainer.source.batches("val", 0, s.batch_tokens, s.max_seq_len, s.seed, False):
            rows = batch["input_ids"].shape[0]
            given = batch.get("sample_index")
            indices = given.tolist() if given is not None else list(range(seen, seen + rows))
            seen += rows
            for row, index in enumerate(indices):
                length = int(batch["attention_mask"][row].sum())
                one = {k: v[row:row + 1, :length].to(trainer.device) for k, v in batch.items()
                       if torch.is_tensor(v) and v.dim() >= 2}
                one = widen(one)
                with amp, variable_shape_attention():
                    targets = target_distribution(one["last_hidden"], trainer.lm_head, model.d2t, model.t2d,
                                                  top=one.get("target_top"))
                    _, stats = ttt_unroll(model, one, targets, s.ttt_steps, s.loss_decay)
                metrics = summarize(stats, s.loss_decay, s.num_steps)
                if metrics["tokens"] > 0:
                    for key, value in (("index", index), ("loss", metrics["loss"]),
                                       ("tau", metrics["predicted_tau"]), ("tokens", metrics["tokens"])):
                        out[key].append(float(value))
    finally:
        model.train()
    return out

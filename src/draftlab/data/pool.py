"""How many samples a job reads from the shared pool; torch-free, so an all-cached preflight can ask."""

from __future__ import annotations


def pool_size(data) -> int:
    """data.samples to train on, plus the fixed validation set (data.val_samples, made first:
    data/prompts.pool_order)."""
    return int(data.samples) + int(data.val_samples or 0)

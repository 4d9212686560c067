"""What one log window of training adds up: per-step stats, tokens, gradient norms and batches.

The sums stay where the step computed them (on the GPU) and are read back only when the window is logged or
checkpointed: a read each step made the host wait for the step to finish before it could queue the next one.
The checkpointed window is plain floats (`fold` adds the pending sums into it); a resumed run folds at the same
steps as an unbroken one, so its logged numbers are the same.
"""

from __future__ import annotations

import torch

from draftlab.train.ttt import STATS


class PendingSums:
    def __init__(self) -> None:
        self.sums: dict | None = None

    def add(self, stats: torch.Tensor, tokens: float, grad_norm: torch.Tensor) -> None:
        if hasattr(grad_norm, "full_tensor"):  # FSDP: the norm is a DTensor; every rank takes part in this reduce
            grad_norm = grad_norm.full_tensor()
        if self.sums is None:
            self.sums = {"stats": torch.zeros_like(stats, dtype=torch.float64),
                         "grad_norm": torch.zeros((), dtype=torch.float64, device=grad_norm.device),
                         "tokens": 0.0, "batches": 0}
        s = self.sums
        s["stats"] += stats
        s["grad_norm"] += grad_norm.detach()
        s["tokens"] += tokens
        s["batches"] += 1

    def fold(self, window: dict | None) -> dict | None:
        """`window` (the checkpointed floats, or None) with the pending sums added; the pending sums restart."""
        s, self.sums = self.sums, None
        if s is None:
            return window
        w = window or {"stats": [[0.0] * s["stats"].shape[1] for _ in STATS], "tokens": 0.0, "grad_norm": 0.0,
                       "batches": 0}
        w["stats"] = (torch.tensor(w["stats"], dtype=torch.float64) + s["stats"].cpu()).tolist()
        w["tokens"] += s["tokens"]
        w["grad_norm"] += float(s["grad_norm"])
        w["batches"] += s["batches"]
        return w

"""Progress bars for the stages (tqdm): per batch or step, with rate and ETA, on stderr.

One place for the settings, so every stage's bar looks the same: off with DRAFTLAB_PROGRESS=0, and sparse (a
line every 30 s) when stderr is not a terminal, so logs of long jobs stay readable.
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm


def bar(total: int | None, desc: str, unit: str, initial: int = 0) -> tqdm:
    interactive = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, initial=initial, dynamic_ncols=True, leave=True,
                mininterval=0.5 if interactive else 30.0, disable=os.environ.get("DRAFTLAB_PROGRESS") == "0")


class StepBar:
    """The train stage's bar, driven by the Trainer's `on_step(step)` callback. The total is read from the
    trainer when the first step arrives (the loop computes it, and a resumed run starts past zero)."""

    def __init__(self, trainer_state: dict, desc: str = "train") -> None:
        self.state, self.desc, self.bar = trainer_state, desc, None

    def __call__(self, step: int) -> None:
        if self.bar is None:
            self.bar = bar(self.state.get("total_steps"), self.desc, "step", initial=step - 1)
        stop = self.state.get("stop_at")  # early stopping moves the end forward (train/loop.py)
        if stop and stop != self.bar.total:
            self.bar.total = stop
        self.bar.update(step - self.bar.n)
        last = self.state.get("last_train") or {}
        if "train/loss" in last:
            self.bar.set_postfix(loss=f"{last['train/loss']:.3f}", epoch=self.state.get("epoch"), refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def bar_over(items: list, desc: str, unit: str):
    """Iterates `items` with a bar (for loops whose length is known up front)."""
    with bar(len(items), desc, unit) as progress:
        for item in items:
            yield item
            progress.update(1)

"""The train.compile_* settings. Apart from train/ttt.py so that the pipeline decides on the compile warm-up
(draftlab/warmup/launch.py) without importing the model code, and torch's compiler with it (1.7 s on the dev machine),
before the generate stage starts."""

from __future__ import annotations

import torch


def compile_wanted(key: str, choice, device: torch.device) -> bool:
    """A train.compile_* setting: auto = on CUDA (on the CPU a step is matmul-bound and compiling costs seconds to
    minutes), true, false."""
    value = str(choice).lower()  # a YAML true arrives as "True" in the str field
    if value not in ("auto", "true", "false"):
        raise ValueError(f"{key}: {choice!r}; expected auto, true or false")
    return device.type == "cuda" if value == "auto" else value == "true"

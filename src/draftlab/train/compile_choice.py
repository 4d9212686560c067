"""The train.compile_* settings. Apart from train/ttt.py so that the pipeline decides on the compile warm-up
(draftlab/warmup/launch.py) without importing the model code, and torch's compiler with it (1.7 s on the dev machine),
before the generate stage starts."""

from __future__ import annotations

import torch

# train.compile_cuda_graphs=auto records graphs for drafts narrower than this: at SmolLM2's 576 the step is
# launch-bound and graphs pay, at Llama-3.1-8B's 4096 the padding and recordings cost more than the launches
# (BENCHMARKS.md "Defaults measured on the GPU"); widths between them are unmeasured
GRAPHS_MAX_HIDDEN = 2048


def compile_wanted(key: str, choice, device: torch.device) -> bool:
    """A train.compile_* setting: auto = on CUDA (on the CPU a step is matmul-bound and compiling costs seconds to
    minutes), true, false."""
    value = str(choice).lower()  # a YAML true arrives as "True" in the str field
    if value not in ("auto", "true", "false"):
        raise ValueError(f"{key}: {choice!r}; expected auto, true or false")
    return device.type == "cuda" if value == "auto" else value == "true"


def cuda_graphs_wanted(choice, device: torch.device, hidden_size: int) -> bool:
    """train.compile_cuda_graphs: auto = on CUDA for a draft narrower than GRAPHS_MAX_HIDDEN, true, false."""
    wanted = compile_wanted("train.compile_cuda_graphs", choice, device)
    return wanted and (str(choice).lower() != "auto" or hidden_size < GRAPHS_MAX_HIDDEN)

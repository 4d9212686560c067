"""`speculators train`, timed (run with speculators' environment: $PEERS/venv-spec/bin/python, or the GPU machine's
python with the peers' wheels on its path). On a GPU it runs as released, but for run.sh's eager loss.

On a machine without an accelerator: speculators 0.9.0 assumes a GPU in four places; each is redirected here, in
this process only:
- it moves the model and batches to `local_rank` (the int 0, i.e. cuda:0): an int device becomes "cpu";
- `torch.accelerator.current_accelerator()` is None on a CPU machine: it answers cpu (autocast device type),
  and `is_available()` keeps answering False;
- its step timer calls `torch.accelerator.synchronize()`: a no-op without an accelerator;
- its DataLoader pins memory: off.
Pass `--draft-attn-impl sdpa` (FlexAttention has no CPU backward) and `--loss-implementation eager` (the
fused loss is a Triton kernel). PEERS_COMPILE=1 compiles its forward on a CPU too, as on a GPU (its decorator
compiles only where it sees CUDA), so that a CPU run goes through torch.compile's tracing as a GPU run does.
Timing: `train_epoch`, minus the validation and checkpoint saves inside it (timing.py).
"""

import os
import sys

import torch
import torch.utils.data

if not torch.accelerator.is_available():
    _to_module, _to_tensor = torch.nn.Module.to, torch.Tensor.to

    def _cpu(args: tuple) -> tuple:
        int_device = args and isinstance(args[0], int) and not isinstance(args[0], bool)
        return ("cpu", *args[1:]) if int_device else args

    torch.nn.Module.to = lambda self, *a, **k: _to_module(self, *_cpu(a), **k)
    torch.Tensor.to = lambda self, *a, **k: _to_tensor(self, *_cpu(a), **k)
    torch.accelerator.current_accelerator = lambda check_available=False: torch.device("cpu")
    torch.accelerator.is_available = lambda: False  # it asks current_accelerator(), which now answers cpu
    torch.accelerator.synchronize = lambda *a, **k: None
    if not hasattr(torch.cpu, "empty_cache"):
        torch.cpu.empty_cache = lambda: None
    _loader_init = torch.utils.data.DataLoader.__init__

    def _unpinned(self, *a, **k):
        _loader_init(self, *a, **{**k, "pin_memory": False})

    torch.utils.data.DataLoader.__init__ = _unpinned

if os.environ.get("PEERS_COMPILE") == "1" and not torch.cuda.is_available():
    _cuda_available = torch.cuda.is_available
    torch.cuda.is_available = lambda: True  # read once, when the decorator wraps its forward at import
    from speculators.models.eagle3.core import Eagle3DraftModel  # noqa: E402

    torch.cuda.is_available = _cuda_available
    if not hasattr(Eagle3DraftModel.forward, "_torchdynamo_orig_callable"):
        sys.exit("PEERS_COMPILE=1: speculators' Eagle3DraftModel.forward was not compiled")

from speculators.__main__ import app  # noqa: E402
from speculators.train.trainer import Trainer  # noqa: E402

if __name__ == "__main__":  # its data workers start by spawn, which imports this file again
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import timing  # here: a worker that imported it would write its own timing.json at exit

    timing.patch(Trainer, "train_epoch", evals=("val_epoch",), saves=("maybe_save_checkpoint",))
    sys.argv = ["speculators", *sys.argv[1:]]
    app()

"""`specforge train`, timed (run with SpecForge's environment: $PEERS/venv-sf/bin/python, or the GPU machine's
python with the peers' wheels on its path).

On a GPU it runs as released. On a machine without one, two process-local patches:
- SpecForge 0.2.0 imports `specforge.core.loss`, whose EAGLE-3 loss is a Triton kernel (no CPU path): a module
  with the same loss in torch (the file's own reference formula, without its torch.compile) is registered under
  that name first;
- with PEERS_FP32=1 (an fp32 run like the others on the CPU): the stored bf16 features are cast to fp32 as they are
  read, and the frozen target head, which SpecForge loads in bf16 whatever the config says, is cast to fp32.
Timing: `TrainerController._fit`, minus evaluation and checkpoint saves inside it (timing.py). After it, outside
the timed part, the draft's weights as SpecForge's own checkpoint filter keeps them go to $PEERS_DRAFT_OUT
(safetensors, for val_loss.py), so no pickled checkpoint needs to be written or read.
"""

import functools
import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402
import specforge.core  # noqa: E402  (its __init__ imports nothing)


def _kl_loss(logits, target_p, position_mask):
    return -(position_mask * target_p * torch.log_softmax(logits.float(), dim=2)).sum(2).mean()


if not torch.cuda.is_available():
    loss_module = types.ModuleType("specforge.core.loss")
    loss_module._compute_loss = _kl_loss
    loss_module.LogSoftmaxLoss = types.SimpleNamespace(apply=_kl_loss)
    sys.modules["specforge.core.loss"] = specforge.core.loss = loss_module

import specforge.algorithms.eagle3.data as eagle3_data  # noqa: E402
from specforge.modeling.target import target_head  # noqa: E402
from specforge.training.controller import TrainerController  # noqa: E402

if os.environ.get("PEERS_FP32") == "1":
    _normalize = eagle3_data.normalize_offline_sample

    def _normalize_fp32(raw, max_len):
        sample = _normalize(raw, max_len)
        sample["hidden_state"], sample["target"] = sample["hidden_state"].float(), sample["target"].float()
        return sample

    eagle3_data.normalize_offline_sample = _normalize_fp32
    _load_head = target_head.TargetHead.from_pretrained.__func__
    target_head.TargetHead.from_pretrained = classmethod(lambda cls, *a, **k: _load_head(cls, *a, **k).float())

timing.patch(TrainerController, "_fit", evals=("evaluate",), saves=("save_checkpoint",))
_timed_fit = TrainerController._fit


@functools.wraps(_timed_fit)
def _fit_then_export(self, *args, **kwargs):
    result = _timed_fit(self, *args, **kwargs)
    path = os.environ.get("PEERS_DRAFT_OUT")
    if path:
        from safetensors.torch import save_file

        state = self.core.strategy.checkpoint_state_filter(self.core.backend.state_dict()["model"])
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items() if torch.is_tensor(v)}, path)
    return result


TrainerController._fit = _fit_then_export

from specforge.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))

"""`specforge train` on a machine without an accelerator, in fp32, timed (run with $PEERS/venv-sf/bin/python).

SpecForge 0.2.0 imports `specforge.core.loss`, whose EAGLE-3 loss is a Triton kernel (no CPU path): a module
with the same loss in torch (the file's own reference formula, without its torch.compile) is registered under
that name first. For an fp32 run like the others: the stored bf16 features are cast to fp32 as they are read,
and the frozen target head, which SpecForge loads in bf16 whatever the config says, is cast to fp32.
Timing: `TrainerController._fit`, minus evaluation and checkpoint saves inside it (timing.py).
"""

import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402
import specforge.core  # noqa: E402  (its __init__ imports nothing)


def _kl_loss(logits, target_p, position_mask):
    return -(position_mask * target_p * torch.log_softmax(logits.float(), dim=2)).sum(2).mean()


loss_module = types.ModuleType("specforge.core.loss")
loss_module._compute_loss = _kl_loss
loss_module.LogSoftmaxLoss = types.SimpleNamespace(apply=_kl_loss)
sys.modules["specforge.core.loss"] = specforge.core.loss = loss_module

import specforge.algorithms.eagle3.data as eagle3_data  # noqa: E402
from specforge.modeling.target import target_head  # noqa: E402
from specforge.training.controller import TrainerController  # noqa: E402

_normalize = eagle3_data.normalize_offline_sample


def _normalize_fp32(raw, max_len):
    sample = _normalize(raw, max_len)
    sample["hidden_state"], sample["target"] = sample["hidden_state"].float(), sample["target"].float()
    return sample


eagle3_data.normalize_offline_sample = _normalize_fp32
_load_head = target_head.TargetHead.from_pretrained.__func__
target_head.TargetHead.from_pretrained = classmethod(lambda cls, *a, **k: _load_head(cls, *a, **k).float())
timing.patch(TrainerController, "_fit", evals=("evaluate",), saves=("save_checkpoint",))

from specforge.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))

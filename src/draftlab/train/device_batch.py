"""A batch on its way from the source to the training step: the packed unroll's plan listed on the host, the copy
to the device, and the widening there. Kept out of the loop so that a source can run the first part where it
builds its batches (the trainer's `prepare`)."""

from __future__ import annotations

import torch

from draftlab.train.packed import PackedPlan


def attach_plan(batch: dict, steps: int) -> dict:
    """The batch with its `packed_plan` (train/packed.py), listed from the host masks. As the trainer's `prepare`
    an offline FeatureSource runs it on its read-ahead worker, off the training thread: on a many-core host a
    string of small CPU ops costs more in intra-op threading than in work (BENCHMARKS.md)."""
    return dict(batch, packed_plan=PackedPlan.of(batch["loss_mask"], batch["attention_mask"], steps))


def to_device(batch: dict, device: torch.device, plan_steps: int | None) -> tuple[dict, PackedPlan | None]:
    """The batch's tensors on `device`, still in the pool's dtype, and with `plan_steps` its packed plan: the one
    the source attached, else listed here. Non-blocking: the reader pins every tensor it returns."""
    if plan_steps and "packed_plan" not in batch:
        batch = attach_plan(batch, plan_steps)
    plan = batch["packed_plan"] if plan_steps else None
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()
            if torch.is_tensor(v) and k != "sample_index"}, plan


def widen(batch: dict) -> dict:
    """Features and the target's last hidden state in fp32. Batches come in the pool's dtype (half the bytes to copy
    and to keep on the device); a draft whose features need no fc (one target layer) takes them as its fp32
    residual, as it did when the reader widened them."""
    return dict(batch, features=batch["features"].float(), last_hidden=batch["last_hidden"].float())

"""A batch on its way from the source to the training step: the packed unroll's plan listed on the host, the copy
to the device, and the widening there. Kept out of the loop so that a source can run the first part where it
builds its batches (the trainer's `prepare`).

A compiled unroll (train/compiled_unroll.py) takes its batches padded to a length that is a multiple of 8: its one
dynamic-shape graph holds for every length, but the compiler also checks how the length sits against 8 (whether a
tensor of T + 1 or T + 7 positions is aligned) and would build another graph for each remainder (seen on an H200).
Padding adds positions after every sequence's end: masked out, never attended to by a real position (attention is
causal), so the loss, gradients and stats are the unpadded batch's (tests/test_device_batch.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftlab.train.packed import PackedPlan

MASKS = ("loss_mask", "attention_mask")


def attach_plan(batch: dict, steps: int, multiple: int = 1) -> dict:
    """The batch with its `packed_plan` (train/packed.py), listed from the host masks padded to a length that is a
    multiple of `multiple`. As the trainer's `prepare` an offline FeatureSource runs it on its read-ahead worker, off
    the training thread: on a many-core host a string of small CPU ops costs more in intra-op threading than in work
    (BENCHMARKS.md)."""
    extra = -batch["loss_mask"].shape[1] % multiple
    masks = [F.pad(batch[key], (0, extra)) for key in MASKS]
    return dict(batch, packed_plan=PackedPlan.of(*masks, steps))


def pad_length(x: torch.Tensor, length: int) -> torch.Tensor:
    """x [B, T, ...] with zeros after position T, to `length` positions."""
    extra = length - x.shape[1]
    return x if extra <= 0 else F.pad(x, (0, 0) * (x.dim() - 2) + (0, extra))


def to_device(batch: dict, device: torch.device, plan_steps: int | None,
              multiple: int = 1) -> tuple[dict, PackedPlan | None]:
    """The batch's tensors on `device`, still in the pool's dtype, and with `plan_steps` its packed plan: the one
    the source attached, else listed here. Padded there to the plan's length (a multiple of `multiple`).
    Non-blocking: the reader pins every tensor it returns."""
    if plan_steps and "packed_plan" not in batch:
        batch = attach_plan(batch, plan_steps, multiple)
    plan = batch["packed_plan"] if plan_steps else None
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items()
           if torch.is_tensor(v) and k != "sample_index"}
    if plan is not None and plan.shape[1] != batch["input_ids"].shape[1]:
        out = {k: pad_length(v, plan.shape[1]) for k, v in out.items()}
    return out, plan


def widen(batch: dict) -> dict:
    """Features and the target's last hidden state in fp32. Batches come in the pool's dtype (half the bytes to copy
    and to keep on the device); a draft whose features need no fc (one target layer) takes them as its fp32
    residual, as it did when the reader widened them."""
    return dict(batch, features=batch["features"].float(), last_hidden=batch["last_hidden"].float())

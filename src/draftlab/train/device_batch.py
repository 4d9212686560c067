"""A batch on its way from the source to the training step: the packed unroll's plan listed on the host, the copy
to the device, and the widening there. Kept out of the loop so that a source can run the first part where it
builds its batches (the trainer's `prepare`).

A compiled unroll (train/compiled_unroll.py) takes its batches padded to a length that is a multiple of 8: its one
dynamic-shape graph holds for every length, but the compiler also checks how the length sits against 8 (whether a
tensor of T + 1 or T + 7 positions is aligned) and would build another graph for each remainder (seen on an H200).
Padding adds positions after every sequence's end: masked out, never attended to by a real position (attention is
causal), so the loss, gradients and stats are the unpadded batch's (tests/unit/test_device_batch.py). An unroll replayed
as CUDA graphs (train.compile_cuda_graphs) also pads rows and the plan's counts, to buckets (`padding_for`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftlab.train.packed import PackedPlan

MASKS = ("loss_mask", "attention_mask")


def attach_plan(batch: dict, steps: int, multiple: int = 1, rows: int = 1, counts: int = 0) -> dict:
    """The batch with its `packed_plan` (train/packed.py), listed from the host masks padded to a length that is a
    multiple of `multiple` and to a row count that is a multiple of `rows`; `counts`: the plan's counts padded to
    one capacity, a multiple of it (`PackedPlan.padded`; 0: not padded). As the trainer's `prepare` an offline
    FeatureSource runs it on its read-ahead worker, off the training thread: on a many-core host a string of small
    CPU ops costs more in intra-op threading than in work."""
    B, T = batch["loss_mask"].shape
    masks = [F.pad(batch[key], (0, -T % multiple, 0, -B % rows)) for key in MASKS]
    plan = PackedPlan.of(*masks, steps)
    return dict(batch, packed_plan=plan.padded(counts) if counts else plan)


def pad_to(x: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """x [B, T, ...] with zeros after row B and after position T, to [rows, length, ...]."""
    extra_rows, extra_length = rows - x.shape[0], length - x.shape[1]
    if extra_rows <= 0 and extra_length <= 0:
        return x
    return F.pad(x, (0, 0) * (x.dim() - 2) + (0, max(extra_length, 0), 0, max(extra_rows, 0)))


def to_device(batch: dict, device: torch.device, plan_steps: int | None, multiple: int = 1, rows: int = 1,
              counts: int = 0) -> tuple[dict, PackedPlan | None]:
    """The batch's tensors on `device`, still in the pool's dtype, and with `plan_steps` its packed plan: the one
    the source attached, else listed here (`attach_plan`'s padding). Padded there to the plan's shape.
    Non-blocking: the reader pins every tensor it returns."""
    if plan_steps and "packed_plan" not in batch:
        batch = attach_plan(batch, plan_steps, multiple, rows, counts)
    plan = batch["packed_plan"] if plan_steps else None
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items()
           if torch.is_tensor(v) and k != "sample_index"}
    if plan is not None and plan.shape != tuple(batch["input_ids"].shape):
        out = {k: pad_to(v, *plan.shape) for k, v in out.items()}
    return out, plan


def padding_for(core, batch_tokens: int, count_bucket: int | None = None) -> dict[str, int]:
    """`attach_plan`'s padding for a trainer's unroll core: none for the eager one; the length to a multiple of 8
    for the compiled one (module docstring); with CUDA graphs (train.compile_cuda_graphs) every size to a few
    buckets, since a graph is recorded for each distinct set of sizes: the length to 64, the rows to 8, the
    plan's counts to one capacity, a multiple of `count_bucket` (train.graph_count_bucket), else of an eighth of
    the token budget (`benchmarks/unroll_sizes.py` counts the sets an epoch has and the filler each costs)."""
    if core is None:
        return {"multiple": 1}
    if not core.cuda_graphs:
        return {"multiple": 8}
    return {"multiple": 64, "rows": 8, "counts": count_bucket or max(64, batch_tokens // 8)}


def widen(batch: dict) -> dict:
    """Features and the target's last hidden state in fp32. Batches come in the pool's dtype (half the bytes to copy
    and to keep on the device); a draft whose features need no fc (one target layer) takes them as its fp32
    residual, as it did when the reader widened them."""
    return dict(batch, features=batch["features"].float(), last_hidden=batch["last_hidden"].float())

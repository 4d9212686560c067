"""torchrun training: `torchrun --nproc-per-node N src/run.py ...` with train.strategy=ddp (the default when
WORLD_SIZE > 1) or fsdp (FSDP2 `fully_shard`, for drafts too big to replicate).

Who does what:
- rank 0 runs the job as one process would: it opens the MLflow run, runs generate and extract, writes every
  stage folder, checkpoint and export. When it reaches the train stage it sends the stage's resolved config,
  folder and inputs to the other ranks (JSON over a gloo group: nothing is unpickled), which then train with
  it and write nothing; at the end it tells them the job is over. The other ranks never open a run.
- the global batch is the same for any N: every rank walks the same token-budget batch plan and takes rows
  r, r+N, ... of each batch. Each rank divides its loss by the loss positions of the *whole* batch (summed over
  ranks), so the gradients that DDP averages (times N) are the single-process batch's gradient, and the summed
  metric counts are the single-process ones: the loss curve equals the one-process curve within float tolerance.
- resume: every rank loads rank 0's last checkpoint (the replicas are equal), so a job restarted with any N
  continues where it stopped.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist

from draftlab.model.attention import variable_shape_attention
from draftlab.train.checkpoint import frozen_names
from draftlab.train.loop import Trainer
from draftlab.train.optim import build_optimizer
from draftlab.train.ttt import soft_ce_rows, target_distribution, ttt_unroll

log = logging.getLogger("draftlab")
_CONTROL = None  # the gloo group that carries the JSON messages (NCCL needs CUDA tensors)
# rank 0 may spend hours generating before it announces training; the others wait that long in a broadcast
WAIT = datetime.timedelta(hours=48)


def world_size() -> int:
    _adopt_submitit_tasks()
    return int(os.environ.get("WORLD_SIZE", "1"))


def _adopt_submitit_tasks() -> None:
    """hydra/launcher=submitit_slurm (or submitit_local) with tasks_per_node > 1 starts one process per GPU
    without torchrun; submitit's own helper exports the torch.distributed variables from SLURM's."""
    if "WORLD_SIZE" not in os.environ and "SUBMITIT_EXECUTOR" in os.environ:
        from submitit import JobEnvironment
        from submitit.helpers import TorchDistributedEnvironment

        if JobEnvironment().num_tasks > 1:
            TorchDistributedEnvironment().export()


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def init() -> None:
    """Joins torchrun's process group once: NCCL on GPUs (one per local rank), gloo on the CPU."""
    global _CONTROL
    if dist.is_initialized():
        return
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # "cuda" then means this rank's GPU
    dist.init_process_group("nccl" if cuda else "gloo", timeout=WAIT)
    _CONTROL = dist.new_group(backend="gloo", timeout=WAIT) if cuda else dist.group.WORLD


def broadcast_json(message: dict | None) -> dict:
    """Rank 0's message to every rank (others pass None): length, then UTF-8 bytes, as tensors."""
    data = json.dumps(message).encode() if is_main() else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(size, 0, group=_CONTROL)
    if is_main():
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    else:
        buf = torch.empty(int(size), dtype=torch.uint8)
    dist.broadcast(buf, 0, group=_CONTROL)
    return json.loads(bytes(buf.tolist()).decode())


def run_task(cfg, single, follow, **kwargs) -> dict[str, float]:
    """The job under torchrun: rank 0 runs `single(cfg, **kwargs)` (the one-process job); the others follow it
    into the train stage, `follow(cfg, out, inputs)`, each time rank 0 runs one."""
    init()
    if is_main():
        try:
            return single(cfg, **kwargs)
        finally:
            broadcast_json({"op": "done"})
    _follow(follow)
    return {}


def _follow(follow) -> None:
    from omegaconf import OmegaConf

    while True:
        message = broadcast_json(None)
        if message["op"] == "done":
            return
        cfg = OmegaConf.create(message["cfg"])
        OmegaConf.set_readonly(cfg, True)
        follow(cfg, Path(message["out"]), {k: Path(v) for k, v in message["inputs"].items()})


def announce_train(cfg, out: Path, inputs: dict[str, Path]) -> None:
    """Called by the train stage: under torchrun, rank 0 brings the other ranks into this stage."""
    if world_size() > 1 and is_main():
        from omegaconf import OmegaConf

        broadcast_json({"op": "train", "cfg": OmegaConf.to_container(cfg, resolve=True), "out": str(out),
                        "inputs": {k: str(v) for k, v in inputs.items()}})


# ---------------------------------------------------------------------------------------------------- data
class RankShard:
    """A FeatureSource whose batches are this rank's rows of the global batch plan (see the module doc)."""

    def __init__(self, source, rank_: int, world: int):
        self.source, self.rank, self.world = source, rank_, world

    def __getattr__(self, name):
        return getattr(self.source, name)

    def batches(self, split, epoch, batch_tokens, max_seq_len, seed, shuffle=True, prepare=None):
        for batch in self.source.batches(split, epoch, batch_tokens, max_seq_len, seed, shuffle):
            batch = local_rows(batch, self.rank, self.world)  # prepare sees this rank's rows, not the whole batch
            yield prepare(batch) if prepare else batch


def local_rows(batch: dict, rank_: int, world: int) -> dict:
    """Rows rank, rank+world, ... of a padded batch, trimmed to their longest row. A rank left without a row
    (a batch of fewer samples than ranks) gets row 0 with no loss position: it joins the collectives and
    adds nothing."""
    size = len(batch["input_ids"])
    rows = list(range(rank_, size, world))
    empty = not rows
    index = torch.tensor(rows or [0], device=batch["input_ids"].device)
    out = {k: (v.index_select(0, index.to(v.device)) if torch.is_tensor(v) and v.dim() and len(v) == size else v)
           for k, v in batch.items()}
    width = int(out["attention_mask"].sum(1).max())
    out = {k: (v[:, :width] if torch.is_tensor(v) and v.dim() >= 2 else v) for k, v in out.items()}
    if empty:
        out["loss_mask"] = torch.zeros_like(out["loss_mask"])
    return out


def loss_positions(batch: dict, targets, steps: int) -> torch.Tensor:
    """[steps] loss positions of this rank's rows, counted as ttt_unroll counts them."""
    B, T = batch["input_ids"].shape
    counted = (batch["loss_mask"] & batch["attention_mask"]).bool()
    counted = torch.cat([counted, counted.new_zeros(B, steps + 2)], 1)
    out = torch.zeros(steps, dtype=torch.float32, device=counted.device)
    for j in range(steps):
        n = T - 1 - j
        if n > 0:
            out[j] = (counted[:, 2 + j:2 + j + n] & targets.in_vocab[:, 1 + j:1 + j + n]).sum()
    return out


# ---------------------------------------------------------------------------------------------------- model
class _Unroll(torch.nn.Module):
    """One forward = the whole TTT unroll, so DDP and FSDP see one forward per backward although the draft
    runs `ttt_steps` times inside it."""

    def __init__(self, draft):
        super().__init__()
        self.draft = draft

    def forward(self, batch, targets, steps: int, decay: float, loss_norm, ce):
        return ttt_unroll(self.draft, batch, targets, steps, decay, loss_norm=loss_norm, ce=ce)


class DistributedTrainer(Trainer):
    """The Trainer with a data-parallel step; only rank 0 writes (checkpoints, best weights)."""

    def __init__(self, *args, strategy: str = "ddp", **kwargs):
        super().__init__(*args, **kwargs)
        self.rank, self.world, self.strategy = rank(), world_size(), strategy
        self.group = None
        # every rank must run the same loss (the compiled one, or the eager fallback after a failed compile)
        compiled = torch.tensor([0.0 if self.ce is soft_ce_rows else 1.0], device=self.device)
        dist.all_reduce(compiled, op=dist.ReduceOp.MIN)
        if float(compiled) == 0.0:
            self.ce = soft_ce_rows
        cuda = self.device.type == "cuda"
        self.packed = False  # the data-parallel step is the padded unroll (its loss positions are summed over ranks)
        if strategy == "fsdp":
            from torch.distributed.fsdp import fully_shard

            self.unroll = _Unroll(self.model)
            for layer in self.model.layers:
                fully_shard(layer)
            fully_shard(self.unroll)
            # the parameters are now shards (DTensors): the optimizer must hold those
            self.opt = build_optimizer(self.model, self.s.lr, self.s.weight_decay, self.device)
        else:
            from torch.nn.parallel import DistributedDataParallel

            self.unroll = DistributedDataParallel(_Unroll(self.model),
                                                  device_ids=[torch.cuda.current_device()] if cuda else None)

    def _forward(self, batch: dict, plan=None):  # plan: always None here (self.packed is False)
        m = self.model
        amp = torch.autocast(self.device.type, dtype=self.amp) if self.amp else contextlib.nullcontext()
        with amp, variable_shape_attention():
            targets = target_distribution(batch["last_hidden"], self.lm_head, m.d2t, m.t2d, top=batch.get("target_top"))
            norm = loss_positions(batch, targets, self.s.ttt_steps)
            dist.all_reduce(norm)
            loss, stats = self.unroll(batch, targets, self.s.ttt_steps, self.s.loss_decay, norm, self.ce)
        dist.all_reduce(stats)  # every rank sees the whole batch's counts: metrics equal the one-process ones
        return loss * self.world, stats  # DDP/FSDP average gradients over ranks; the losses are shares of a sum

    def _write_checkpoint(self, name: str, tensors: dict, optimizer_state: dict) -> None:
        # every rank got here through _save (FSDP: gathering the shards is a collective); rank 0 writes
        if self.rank == 0:
            super()._write_checkpoint(name, tensors, optimizer_state)
        dist.barrier()

    def _write_weights(self, path: Path) -> None:
        tensors = self._model_tensors()  # FSDP: a collective, so every rank gathers
        if self.rank == 0:
            self._queue_weights(path, tensors)

    # FSDP: the checkpoint holds full tensors in the one-process layout, so any N (or one process) resumes it.
    def _model_tensors(self) -> dict[str, torch.Tensor]:
        if self.strategy != "fsdp":
            return super()._model_tensors()
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        full = get_model_state_dict(self.unroll, options=_full_options())
        frozen = frozen_names(self.model)
        return {k[len("draft."):]: v for k, v in full.items() if k[len("draft."):] not in frozen}

    def _optimizer_state(self) -> dict:
        if self.strategy != "fsdp":
            return super()._optimizer_state()
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        full = get_optimizer_state_dict(self.unroll, self.opt, options=_full_options())
        if not full:  # cpu_offload hands the full state to rank 0 only
            return {"state": {}, "param_groups": []}
        order = [name for group in full["param_groups"] for name in group["params"]]
        index = {name: i for i, name in enumerate(order)}  # the positions torch's own state_dict() uses
        groups, start = [], 0
        for group in full["param_groups"]:
            groups.append({**group, "params": list(range(start, start + len(group["params"])))})
            start += len(group["params"])
        return {"state": {index[name]: st for name, st in full["state"].items()}, "param_groups": groups}

    def _load_states(self, model_file: Path, optimizer_state: dict) -> None:
        if self.strategy != "fsdp":
            return super()._load_states(model_file, optimizer_state)
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)

        options = StateDictOptions(full_state_dict=True, strict=False)
        weights = {f"draft.{k}": v for k, v in load_file(str(model_file)).items()}
        set_model_state_dict(self.unroll, weights, options=options)
        name_of = {id(p): n for n, p in self.unroll.named_parameters()}
        names = [name_of[id(p)] for group in self.opt.param_groups for p in group["params"]]  # index -> name
        groups = [{**g, "params": [names[i] for i in g["params"]]} for g in optimizer_state["param_groups"]]
        state = {names[i]: st for i, st in optimizer_state["state"].items()}
        set_optimizer_state_dict(self.unroll, self.opt, {"state": state, "param_groups": groups}, options=options)

    def _prune_best(self, *args) -> None:
        if self.rank == 0:
            super()._prune_best(*args)

    def run(self, init_from=None):
        result = super().run(init_from)
        if self.strategy == "fsdp":
            self._unshard()
        return result

    def _unshard(self) -> None:
        """FSDP: rank 0 gets a plain (unsharded) draft with the full weights, for the stage to export."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        full = get_model_state_dict(self.unroll, options=_full_options())  # collective
        if self.rank == 0:
            plain = type(self.model)(self.model.cfg)
            plain.load_state_dict({k[len("draft."):]: v for k, v in full.items()})
            frozen = frozen_names(self.model)
            for name, param in plain.named_parameters():  # the best weights leave the frozen ones out
                param.requires_grad_(name not in frozen)
            self.model = plain.to(self.device)


def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def make_trainer(model, source, lm_head, settings, ckpt_dir: Path, reporter) -> Trainer:
    """The single-process Trainer, or under torchrun the DistributedTrainer of train.strategy over a RankShard."""
    world = world_size()
    if world <= 1:
        if settings.strategy in ("ddp", "fsdp"):
            log.info("train.strategy=%s with one process: training without a process group", settings.strategy)
        return Trainer(model, source, lm_head, settings, ckpt_dir, reporter)
    init()
    strategy = "ddp" if settings.strategy == "auto" else settings.strategy
    log.info("train: %s over %d processes (rank %d)", strategy, world, rank())
    return DistributedTrainer(model, RankShard(source, rank(), world), lm_head, settings, ckpt_dir, reporter,
                              strategy=strategy)

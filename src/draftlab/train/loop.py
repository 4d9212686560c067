"""The training loop: AdamW, warmup + cosine|linear|constant|wsd schedule, grad clipping, token-budget batches,
validation per epoch or every `eval_every` steps, best-checkpoint tracking, early stopping and resumable
checkpoints.

Budget: `max_steps` optimizer steps when set, else `epochs` passes over the data; the schedule is sized to it.
Early stopping (`early_stop_patience`): the run stops when even the hopeful end of the recent val/loss slope's
interval gains under `early_stop_min_delta` of the loss in that many passes (train/schedule.py). Under `wsd` the
plateau starts the decay instead (after `extend_steps` more at constant lr: the steps probe): the learning rate
falls to zero over `decay_ratio` x the steps so far, then the run stops; other schedules stop at once.
`bench_every` benches the deployed draft every that many steps (`train/bench_tau`, train/bench_tau.py); with
`stop_on: tau` the best checkpoint and the plateau watch read -tau at those points instead of val/loss.

Resume contract: a killed run restarted on the same folder continues from its last checkpoint and ends where an
uninterrupted run would (bit-identical on CPU). A checkpoint holds the trainable weights and the AdamW state
(safetensors), the RNG states, and JSON for the rest: epoch, batch position, optimizer step, the schedule's
decay start and stop step (the learning rate is a pure function of them), the plateau watch, the metric window
and the validation history. Nothing is ever unpickled. Checkpoints and best weights are written on a thread from
copies taken at the save (train/file_queue.py), so the GPU does not wait for the disk; `run` returns after them.

Host syncs: a training step reads nothing back from the GPU, so the host queues the next step while the GPU runs
this one: the packed unroll's rows are listed from the host batch (`PackedPlan`), batches are pinned, and the log
window's sums stay on the device until it is logged or checkpointed (train/window.py).

Data: `source.batches(split, epoch, batch_tokens, max_seq_len, seed, shuffle, prepare=None)` must give the same
batches for the same arguments, each mapped by `prepare` when given (an offline FeatureSource maps them on its
read-ahead worker, other sources in line); resume skips the batches of the epoch that were already consumed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import OmegaConf

from draftlab.util import fsutil
from draftlab.model.attention import variable_shape_attention
from draftlab.config.config_schema import TrainConfig
from draftlab.model.draft import Eagle3Draft
from draftlab.util.reporting import NullReporter, Reporter
from draftlab.target.target import resolve_device
from draftlab.train.checkpoint import (host_copies, load_trainable, latest_checkpoint,
                                       read_checkpoint, resolve_checkpoint, snapshot_checkpoint, trainable_state,
                                       write_snapshot)
from draftlab.train.compiled_unroll import unroll_core_for
from draftlab.train.device_batch import attach_plan, padding_for, to_device, widen
from draftlab.train.file_queue import FileQueue
from draftlab.train.optim import autocast_dtype, build_optimizer
from draftlab.train.packed import PackedPlan, packed_unroll
from draftlab.train.schedule import batches_per_epoch, budget_steps, lr_factor, slope_metrics
from draftlab.train.scored import ScoredPoints
from draftlab.train.ttt import STATS, soft_ce_for, summarize, target_distribution, ttt_unroll
from draftlab.train.val_cache import ValidationCache
from draftlab.train.window import PendingSums

log = logging.getLogger("draftlab")
# a GPU batch takes the packed unroll while at most this share of its positions count: measured 1.13x at 60%
# (40% prompt), 0.90x at 100%; the break-even between them was not measured
PACKED_MAX_KEPT = 0.8


@dataclass
class LoopSettings(TrainConfig):
    """The `train` config section (defaults are the schema's) plus the one serving setting metrics need."""

    num_steps: int = 4  # serve.num_steps: how many full_acc_j enter predicted_tau

    @classmethod
    def from_cfg(cls, cfg) -> "LoopSettings":
        return cls(**OmegaConf.to_container(cfg.train, resolve=True), num_steps=int(cfg.serve.num_steps))


@dataclass
class TrainResult:
    final: dict[str, float]  # last train window + last validation, prefixed
    best: dict[str, float]  # best/epoch, best/step, best/val_loss, best/predicted_tau, ...
    history: list[dict[str, float]]  # one entry per validation pass: epoch, step, val/* metrics
    best_weights: Path  # trainable weights of the best validation pass (safetensors)
    steps: int = 0
    extras: dict[str, Any] = field(default_factory=dict)


class Trainer(ScoredPoints):
    def __init__(self, model: Eagle3Draft, source, lm_head: torch.Tensor, settings: LoopSettings,
                 ckpt_dir: Path, reporter: Reporter | None = None,
                 on_step: Callable[[int], None] | None = None, bench: Callable | None = None) -> None:
        self.s = settings
        self.device = resolve_device(settings.device)
        self.amp = autocast_dtype(self.device, settings.dtype)
        self.model = model.to(self.device)
        self.source = source
        # the target head in the matmul dtype: 1 GB instead of 2 for a 128k x 4096 head in bf16
        self.lm_head = lm_head.to(self.device, self.amp or torch.float32)
        self.ckpt_dir = Path(ckpt_dir)
        self.reporter = reporter or NullReporter()
        self.on_step, self.bench = on_step, bench  # bench(model) -> deployed tau (train/bench_tau.py)
        self.opt = build_optimizer(self.model, settings.lr, settings.weight_decay, self.device)
        # Computing only the positions that count (train/packed.py: same loss and gradients) pays on the CPU, and on
        # an H200 when a batch is about 40% prompt (ShareGPT's: 1.13x at 16,384 tokens); with every position counted
        # it was 0.90x there, so a GPU batch where more than PACKED_MAX_KEPT count is unrolled padded.
        self.packed = True
        self.max_kept = 1.0 if self.device.type == "cpu" else PACKED_MAX_KEPT
        self.ce = soft_ce_for(settings.compile_loss, self.device, self.amp or torch.float32)
        self.core = unroll_core_for(settings.compile_unroll, self.device, settings.compile_cpp_wrapper,
                                    settings.compile_cuda_graphs, model.cfg.hidden_size)  # None: eager
        self.padding = padding_for(self.core, settings.batch_tokens, settings.graph_count_bucket)
        self._data_wait = 0.0  # seconds this log window waited for batches (train/data_wait_frac)
        self._pending = PendingSums()  # the log window's sums since it was last folded, on the device
        self._val_cache = ValidationCache(self.device)
        self._files = FileQueue()  # checkpoints and best weights written while the steps go on (train/file_queue.py)
        self.state: dict[str, Any] = {"epoch": 0, "batch": 0, "step": 0, "history": [], "best": None,
                                      "window": None, "total_steps": None, **self._fresh_horizon()}

    @staticmethod
    def _fresh_horizon() -> dict[str, Any]:
        """The state that belongs to one budget: reset when train.init_from continues with a new one."""
        return {"epoch_batches": None, "stop_at": None, "decay_start": None, "plateau": None, "stopped_early": False,
                "last_eval_step": None, "final_slope": None, "plateau_step": None}

    # ------------------------------------------------------------------ one batch
    def _to_device(self, batch: dict) -> tuple[dict, PackedPlan | None]:  # widened, with its plan
        out, plan = self._copy_to_device(batch)
        return widen(out), plan

    def _copy_to_device(self, batch: dict) -> tuple[dict, PackedPlan | None]:  # in the pool's dtype
        return to_device(batch, self.device, self.s.ttt_steps if self.packed else None, **self.padding)

    @property
    def _prepare(self):
        """What the source maps each batch with: the packed plan listed where it builds batches (none unpacked)."""
        return self._attach_plan if self.packed else None  # the data-parallel trainer turns packing off after init

    def _attach_plan(self, batch: dict) -> dict:
        return attach_plan(batch, self.s.ttt_steps, **self.padding)

    def _forward(self, batch: dict, plan: PackedPlan | None = None):
        m = self.model
        amp = torch.autocast(self.device.type, dtype=self.amp) if self.amp else contextlib.nullcontext()
        with amp, variable_shape_attention():  # every batch has its own shapes
            if self.packed:
                return packed_unroll(m, batch, self.lm_head, self.s.ttt_steps, self.s.loss_decay, ce=self.ce,
                                     max_kept=self.max_kept, plan=plan, core=self.core)
            targets = target_distribution(batch["last_hidden"], self.lm_head, m.d2t, m.t2d, top=batch.get("target_top"))
            return ttt_unroll(m, batch, targets, self.s.ttt_steps, self.s.loss_decay, ce=self.ce)

    def build_graphs(self, batch: dict) -> None:
        """A training step's forward and backward on a batch as the source gives it, with no update: what the first
        step compiles gets built (the compile warm-up: warmup/compile.py)."""
        self._forward(*self._to_device(batch))[0].backward()

    def evaluate(self, split: str = "val") -> dict[str, float] | None:
        self.model.eval()
        total = None
        s = self.s

        def read():
            for batch in self.source.batches(split, 0, s.batch_tokens, s.max_seq_len, s.seed, False,
                                             prepare=self._prepare):
                yield self._copy_to_device(batch)

        with torch.no_grad():
            for batch, plan in self._val_cache.passes(split, read):  # on a GPU, read once (train/val_cache.py)
                _, stats = self._forward(widen(batch), plan)
                total = stats if total is None else total + stats
        self.model.train()
        if total is None or float(total[STATS.index("n"), 0]) == 0:
            return None
        return summarize(total, self.s.loss_decay, self.s.num_steps)

    # ------------------------------------------------------------------ checkpoints
    # The state accessors are where data-parallel training (train/distributed.py, FSDP) gathers and scatters.
    def _model_tensors(self) -> dict[str, torch.Tensor]:
        return trainable_state(self.model)

    def _optimizer_state(self) -> dict:
        return self.opt.state_dict()

    def _write_weights(self, path: Path) -> None:
        self._queue_weights(path, self._model_tensors())

    def _queue_weights(self, path: Path, tensors: dict[str, torch.Tensor]) -> None:
        self._files.submit(fsutil.atomic_save_safetensors, path, host_copies(tensors))

    def _load_states(self, model_file: Path, optimizer_state: dict) -> None:
        load_trainable(self.model, model_file)
        self.opt.load_state_dict(optimizer_state)

    def _save(self) -> None:
        self.state["window"] = self._pending.fold(self.state["window"])  # on every rank: their windows stay equal
        name = f"ckpt-{self.state['step']:09d}-e{self.state['epoch']:04d}-b{self.state['batch']:09d}"  # sorts by age
        self._write_checkpoint(name, self._model_tensors(), self._optimizer_state())

    def _write_checkpoint(self, name: str, tensors: dict, optimizer_state: dict) -> None:
        snapshot = snapshot_checkpoint(tensors, optimizer_state, dict(self.state, settings=vars(self.s)))
        self._files.submit(write_snapshot, self.ckpt_dir, name, snapshot)

    def load(self, folder: Path, full: bool = True) -> None:
        """Restores weights, optimizer, RNG and position from a checkpoint folder."""
        state, optimizer = read_checkpoint(folder)
        self._load_states(Path(folder) / "model.safetensors", optimizer)
        self.state.update(state)
        if self.state["last_eval_step"] is None and self.state["history"]:  # an older checkpoint's last pass
            self.state["last_eval_step"] = int(self.state["history"][-1]["step"])
        if not full:  # continuing with a new horizon (train.init_from): keep weights, optimizer and history
            self.state.update(total_steps=None, **self._fresh_horizon())
            self.state["last_eval_step"] = self.state["step"]  # the source's last pass already validated it

    # ------------------------------------------------------------------ logging
    def _log_window(self, t0: float) -> float:
        window = self.state["window"] = self._pending.fold(self.state["window"])
        if not window:
            return t0
        stats = torch.tensor(window["stats"], dtype=torch.float64)
        metrics = {f"train/{k}": v for k, v in summarize(stats, self.s.loss_decay, self.s.num_steps).items()}
        elapsed = max(time.perf_counter() - t0, 1e-9)
        metrics["train/tokens_per_s"] = window["tokens"] / elapsed
        metrics["train/data_wait_frac"] = min(self._data_wait / elapsed, 1.0)
        self._data_wait = 0.0
        metrics["lr"] = self.opt.param_groups[0]["lr"]
        metrics["train/grad_norm"] = window["grad_norm"] / max(window["batches"], 1)
        metrics["epoch"] = float(self.state["epoch"])
        self.reporter.metrics(metrics, step=self.state["step"])
        self.state["last_train"] = metrics
        self.state["window"] = None
        return time.perf_counter()

    # ------------------------------------------------------------------ the loop
    def run(self, init_from: str | Path | None = None) -> TrainResult:
        """Trains to the budget (or the plateau), resuming from the folder's last checkpoint; returns, or raises,
        once every file it queued is written."""
        with self._files:
            return self._run(init_from)

    def _run(self, init_from: str | Path | None) -> TrainResult:
        s = self.s
        latest = latest_checkpoint(self.ckpt_dir)
        if latest:
            self.load(latest)
            log.info("train: resuming at epoch %d batch %d (step %d)", self.state["epoch"], self.state["batch"],
                     self.state["step"])
        elif init_from:
            source_ckpt = resolve_checkpoint(init_from)
            self.load(source_ckpt, full=False)
            if self.state["best"]:  # bring the best weights along so export works from this folder alone
                # atomically: under torchrun every rank copies, and no rank may see another's half-written file
                best = self.state["best"]["file"]
                fsutil.atomic_write_with(self.ckpt_dir / best, lambda tmp: shutil.copy2(source_ckpt.parent / best, tmp))
        else:
            torch.manual_seed(s.seed)
            random.seed(s.seed)
        st = self.state
        if st["epoch_batches"] is None:  # also for a checkpoint written before the step budget existed
            st["epoch_batches"] = batches_per_epoch(self.source, s)
        if st["total_steps"] is None:
            st["total_steps"] = budget_steps(st["epoch_batches"], s)
        if st["stop_at"] is None:
            st["stop_at"] = st["total_steps"]
        self.start_step = st["step"]  # > 0 when resumed or continued: this process pays only for the rest
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.model.train()
        self._t0, self._data_wait = time.perf_counter(), 0.0
        while st["step"] < st["stop_at"]:
            epoch, skip, stepped = st["epoch"], st["batch"], False
            for index, batch in enumerate(self._train_batches(epoch)):
                if index < skip:
                    continue
                if index == skip > 0:  # resumed mid-epoch: reading past the done batches is not this window's time
                    self._t0, self._data_wait = time.perf_counter(), 0.0
                self._train_step(batch, index, params)
                stepped = True
                if self._after_step() or st["step"] >= st["stop_at"]:
                    break
            else:  # the source gave fewer batches than it counted: the epoch ends here all the same
                if not stepped:
                    raise RuntimeError(f"train: epoch {epoch} gave no batches after batch {skip}")
                if st["epoch"] == epoch:
                    self._end_epoch()
        self._t0 = self._log_window(self._t0)
        if st["last_eval_step"] != st["step"]:
            self._validate()
        if self.bench is not None and (st.get("bench") or [{}])[-1].get("step") != st["step"]:
            self._bench()  # the final draft too: a curve that ends where training did, and a best under stop_on tau
        self._save()
        self._prune_best()
        return self._result()

    def _train_batches(self, epoch: int):
        """The epoch's batches, with the time spent waiting for each added to the log window's data wait: a trainer
        whose train/data_wait_frac is high is fed too slowly (reads, collation), not computing too slowly. The
        caller's loop holds the only reference, so leaving it early closes the source's read-ahead at once."""
        s = self.s
        batches = iter(self.source.batches("train", epoch, s.batch_tokens, s.max_seq_len, s.seed, True,
                                           prepare=self._prepare))
        while True:
            t = time.perf_counter()
            batch = next(batches, None)
            self._data_wait += time.perf_counter() - t
            if batch is None:
                return
            yield batch

    def _train_step(self, batch: dict, index: int, params: list) -> None:
        s, st = self.s, self.state
        lr = s.lr * lr_factor(st["step"], st["total_steps"], s.warmup_ratio, s.schedule, st["decay_start"],
                              st["stop_at"], s.decay_ratio)
        for group in self.opt.param_groups:
            group["lr"] = lr
        loss, stats = self._forward(*self._to_device(batch))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, s.grad_clip if s.grad_clip > 0 else float("inf"))
        self.opt.step()
        st["step"] += 1
        st["batch"] = index + 1
        self._pending.add(stats, float(batch["attention_mask"].sum()), norm)

    def _after_step(self) -> bool:
        """Logging, validation, checkpoints after one step; True when the step ended its epoch."""
        s, st = self.s, self.state
        step, end_of_epoch = st["step"], st["batch"] >= st["epoch_batches"]
        if step % s.log_every == 0:
            self._t0 = self._log_window(self._t0)
        if s.eval_every and step % s.eval_every == 0:
            self._validate()
        if self.bench is not None and s.bench_every and step % s.bench_every == 0:
            self._bench()
        if end_of_epoch:
            self._end_epoch()
        elif step % s.checkpoint_every == 0:
            self._save()
        if self.on_step is not None:
            self.on_step(step)
        return end_of_epoch

    def _end_epoch(self) -> None:
        """Closes a pass over the data: per-epoch validation (when eval_every is unset), next epoch, checkpoint."""
        self._t0 = self._log_window(self._t0)
        if not self.s.eval_every:
            self._validate()
        self.state["epoch"], self.state["batch"] = self.state["epoch"] + 1, 0
        self._save()
        self._prune_best()

    def _result(self) -> TrainResult:
        best = self.state["best"]
        final = dict(self.state.get("last_train") or {})
        if self.state["history"]:
            final.update({k: v for k, v in self.state["history"][-1].items() if k.startswith("val/")})
        best_metrics = {"best/epoch": float(best["epoch"]), "best/step": best["metrics"]["step"]}
        bm = best["metrics"]
        if "val/loss" in bm:
            best_metrics.update({"best/val_loss": bm["val/loss"], "best/predicted_tau": bm["val/predicted_tau"],
                                 "best/val_acc_0": bm["val/acc_0"]})
        if "train/bench_tau" in bm:
            best_metrics["best/bench_tau"] = bm["train/bench_tau"]
        epochs_seen = self.state["step"] / max(1, self.state["epoch_batches"] or 1)
        budget = {"train/steps": float(self.state["step"]), "train/epochs_seen": epochs_seen,
                  "train/stopped_early": float(bool(self.state["stopped_early"])),
                  "train/new_steps": float(self.state["step"] - self.start_step), **slope_metrics(self.state, self.s)}
        final.update(budget)
        self.reporter.metrics({**best_metrics, **budget}, step=self.state["step"])
        return TrainResult(final=final, best=best_metrics, history=list(self.state["history"]),
                           best_weights=self.ckpt_dir / best["file"], steps=self.state["step"])

"""The scored points of a training run: validation passes, benches of the deployed draft (`train.bench_every`),
the best checkpoint and the plateau watch of early stopping. A mixin of the Trainer (train/loop.py), which holds
the state, the model, the reporter and the checkpoint folder these read and write.

`stop_on`: loss scores each validation pass by val/loss; tau scores each bench by -train/bench_tau (a validation
pass is run at that step too, so the best checkpoint's metrics hold val/* as well): a draft whose deployed tau
peaks while val/loss still falls is exported at the peak.
"""

from __future__ import annotations

import logging
import math
import time

from draftlab.train.checkpoint import prune_best_files
from draftlab.train.schedule import watch_plateau

log = logging.getLogger("draftlab")


class ScoredPoints:
    def _validate(self) -> None:
        """One validation pass: history entry, best checkpoint, and the plateau watch of early stopping."""
        epoch, step = self.state["epoch"], self.state["step"]
        started = time.perf_counter()
        val = self.evaluate("val")
        seconds = time.perf_counter() - started  # logged only: a recorded wall time would differ on resume
        entry = {"epoch": float(epoch), "step": float(step)}
        if val is not None:
            entry.update({f"val/{k}": v for k, v in val.items()})
            self.reporter.metrics(entry, step=step)
            best = self.state["best"]
            # in the log too: a job killed before its results are written still shows its curve (rank 0 only)
            if getattr(self, "rank", 0) == 0:
                log.info("train: step %d val/loss %.4f val/acc_0 %.4f val/predicted_tau %.3f, a %.1f s pass "
                         "(best so far %s)", step, val["loss"], val["acc_0"], val["predicted_tau"], seconds,
                         "-" if best is None else f"{best['score']:.4f} at step {int(best['metrics']['step'])}")
        self.state["history"].append(entry)
        self.state["last_eval_step"] = step
        if self.s.stop_on != "tau":
            self._keep_best(entry.get("val/loss", self.state.get("last_train", {}).get("train/loss", math.inf)), entry)

    def _bench(self) -> None:
        """Deployed tau of the current draft at this step; with stop_on tau, a validation pass too, and -tau is
        the score of the best checkpoint and of the plateau watch."""
        st = self.state
        tau = float(self.bench(self.model))
        entry = {"epoch": float(st["epoch"]), "step": float(st["step"]), "train/bench_tau": tau}
        self.reporter.metrics({"train/bench_tau": tau}, step=st["step"])
        st["bench"] = (st.get("bench") or []) + [entry]
        log.info("train: step %d train/bench_tau %.3f", st["step"], tau)
        if self.s.stop_on == "tau":
            if st["last_eval_step"] != st["step"]:
                self._validate()
            self._keep_best(-tau, {**st["history"][-1], **entry})

    def _keep_best(self, score: float, entry: dict) -> None:
        """The best checkpoint (lowest score: val/loss, or -tau) and the plateau watch, at one scored point."""
        epoch, step, best = self.state["epoch"], self.state["step"], self.state["best"]
        if best is None or score < best["score"]:
            file = self.ckpt_dir / f"best-epoch{epoch}-step{step:09d}.safetensors"
            self._write_weights(file)
            self.state["best"] = {"epoch": epoch, "score": score, "file": file.name, "metrics": entry}
        if self.s.early_stop_patience and math.isfinite(score):
            self._watch_plateau(score)

    def _watch_plateau(self, score: float) -> None:
        stop = watch_plateau(self.state, score, self.s)
        if stop is not None:
            log.info("train: val/loss plateau at step %d: %s", self.state["step"],
                     f"decaying until step {stop}" if stop > self.state["step"] else "stopping")

    def _prune_best(self) -> None:
        # queued behind the writes before it, so the best file it keeps exists by then
        self._files.submit(prune_best_files, self.ckpt_dir, self.state["best"]["file"] if self.state["best"] else None)


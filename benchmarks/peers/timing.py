"""Times a trainer from inside its process, with nothing on disk changed.

`patch(cls, loop, evals, saves)` wraps methods of the trainer class: `train_s` is the time spent inside `loop`
minus the evaluation and checkpoint calls made from inside it, i.e. the time the optimizer steps took, data
loading included. Process CPU time is kept next to it (load-independent when the machine is shared).

Every trainer steps a torch optimizer once a batch, so a global optimizer-step hook counts steps the same way
for all three: every $PEERS_SYNC_EVERY steps (default 5) it waits for the GPU and marks (step, time). A steady
rate is then read between two marks, away from the compile and warm-up at the start (summary.py), with the
evaluation and saves inside that window (`inner_spans`) left out. One sync in five steps costs a queued trainer
little; a sync every step would take away the host/GPU overlap each trainer relies on.

$PEERS_PROFILE_STEP=k records step k+1 (from the end of step k's optimizer step to the end of k+1's) with
torch.profiler and writes its top kernels to $PEERS_PROFILE_OUT. At exit the numbers, the peak GPU memory this
process allocated included, go to the JSON file named by $PEERS_TIMING.
"""

import atexit
import functools
import json
import os
import time

totals = {"loop_s": 0.0, "loop_cpu_s": 0.0, "inner_s": 0.0, "inner_cpu_s": 0.0, "calls": {}, "steps": 0,
          "marks": [], "inner_spans": [], "started": time.perf_counter()}
_depth = {"loop": 0, "inner": 0}  # nesting: a save called from a save is counted once
_profile = {"prof": None, "optimizer": None}
SYNC_EVERY = int(os.environ.get("PEERS_SYNC_EVERY", "5"))
PROFILE_STEP = int(os.environ.get("PEERS_PROFILE_STEP", "0"))
totals["profile_step"] = PROFILE_STEP


def _cuda_ready() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _sync() -> None:
    if _cuda_ready():
        import torch

        torch.cuda.synchronize()


def _wrap(cls, name: str, is_loop: bool) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        totals["calls"][name] = totals["calls"].get(name, 0) + 1
        outermost = _depth["loop"] > 0 and _depth["inner"] == 0
        if outermost:
            _sync()  # the steps queued before an evaluation are training time
        _depth["loop" if is_loop else "inner"] += 1
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            _depth["loop" if is_loop else "inner"] -= 1
            if outermost:
                _sync()
            end = time.perf_counter()
            wall, cpu = end - wall, time.process_time() - cpu
            if is_loop:
                totals["loop_s"] += wall
                totals["loop_cpu_s"] += cpu
            elif outermost:  # an eval or a save inside the loop: not training time
                totals["inner_s"] += wall
                totals["inner_cpu_s"] += cpu
                totals["inner_spans"].append([end - wall - totals["started"], end - totals["started"]])

    setattr(cls, name, timed)


def patch(cls, loop: str, evals: tuple[str, ...] = (), saves: tuple[str, ...] = ()) -> None:
    _wrap(cls, loop, True)
    exclude(cls, *evals, *saves)
    _count_steps()


def exclude(cls, *names: str) -> None:
    """Methods (of any class) whose calls from inside the loop are not training time."""
    for name in names:
        _wrap(cls, name, False)


def _after_step(optimizer, args, kwargs) -> None:
    # one count per batch: a trainer with two optimizers (Muon + AdamW) steps both
    if _profile["optimizer"] is None:
        _profile["optimizer"] = id(optimizer)
    if id(optimizer) != _profile["optimizer"]:
        return
    totals["steps"] += 1
    step = totals["steps"]
    if step % SYNC_EVERY == 0:
        _sync()
        totals["marks"].append([step, time.perf_counter() - totals["started"]])
    if PROFILE_STEP and step in (PROFILE_STEP, PROFILE_STEP + 1):
        _profile_step(step == PROFILE_STEP)


def _profile_step(start: bool) -> None:
    """Starts the profiler after step k, stops it after step k+1; a failure is written, never raised."""
    from torch.profiler import ProfilerActivity, profile

    path = os.environ.get("PEERS_PROFILE_OUT", "profile.txt")
    try:
        if start:
            cuda = _cuda_ready()
            _profile["prof"] = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
            _profile["prof"].start()
            _profile["cuda"] = cuda
        elif _profile["prof"] is not None:
            _sync()
            _profile["prof"].stop()
            key = "self_cuda_time_total" if _profile["cuda"] else "self_cpu_time_total"
            table = _profile["prof"].key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70)
            with open(path, "w") as f:
                f.write(f"one training step (step {totals['steps']}), top operators and kernels by {key}\n{table}\n")
    except Exception as error:  # the run goes on without its profile
        with open(path, "a") as f:
            f.write(f"profiling failed: {type(error).__name__}: {error}\n")
        _profile["prof"] = None


def _count_steps() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    if not totals.get("hooked"):
        register_optimizer_step_post_hook(_after_step)
        totals["hooked"] = True


@atexit.register
def _write() -> None:
    path = os.environ.get("PEERS_TIMING")
    if not path:
        return
    totals["train_s"] = totals["loop_s"] - totals["inner_s"]
    totals["train_cpu_s"] = totals["loop_cpu_s"] - totals["inner_cpu_s"]
    totals.pop("hooked", None)
    try:
        if _cuda_ready():
            import torch

            totals["peak_alloc_gb"] = torch.cuda.max_memory_allocated() / 2**30
            totals["gpu"] = torch.cuda.get_device_name()
    except Exception:  # a CUDA error at exit leaves the timings
        pass
    with open(path, "w") as f:
        json.dump(totals, f, indent=1)

"""Times a trainer's training loop from inside its process, with nothing on disk changed.

`patch(cls, loop, evals, saves)` wraps methods of the trainer class: `train_s` is the time spent inside `loop`
minus the evaluation and checkpoint calls made from inside it, i.e. the time the optimizer steps took, data
loading included. Process CPU time is kept next to it (load-independent when the machine is shared). At exit
the numbers go to the JSON file named by $CPU_PEERS_TIMING.
"""

import atexit
import functools
import json
import os
import time

totals = {"loop_s": 0.0, "loop_cpu_s": 0.0, "inner_s": 0.0, "inner_cpu_s": 0.0, "calls": {}}
_depth = {"loop": 0, "inner": 0}  # nesting: a save called from a save is counted once


def _wrap(cls, name: str, is_loop: bool) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        totals["calls"][name] = totals["calls"].get(name, 0) + 1
        outermost = _depth["loop"] > 0 and _depth["inner"] == 0
        _depth["loop" if is_loop else "inner"] += 1
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            _depth["loop" if is_loop else "inner"] -= 1
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if is_loop:
                totals["loop_s"] += wall
                totals["loop_cpu_s"] += cpu
            elif outermost:  # an eval or a save inside the loop: not training time
                totals["inner_s"] += wall
                totals["inner_cpu_s"] += cpu

    setattr(cls, name, timed)


def patch(cls, loop: str, evals: tuple[str, ...] = (), saves: tuple[str, ...] = ()) -> None:
    _wrap(cls, loop, True)
    exclude(cls, *evals, *saves)


def exclude(cls, *names: str) -> None:
    """Methods (of any class) whose calls from inside the loop are not training time."""
    for name in names:
        _wrap(cls, name, False)


@atexit.register
def _write() -> None:
    path = os.environ.get("CPU_PEERS_TIMING")
    if path:
        totals["train_s"] = totals["loop_s"] - totals["inner_s"]
        totals["train_cpu_s"] = totals["loop_cpu_s"] - totals["inner_cpu_s"]
        with open(path, "w") as f:
            json.dump(totals, f, indent=1)

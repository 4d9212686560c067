"""draftlab's `src/run.py`, unchanged, with `Trainer.run` timed (minus validation passes and checkpoint writes inside it;
since the writes run on a thread, 2026-12-04, they may still slow the steps they overlap on a 2-core machine).
Run from the tree to measure (its src/ first on PYTHONPATH)."""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402
from draftlab.train import file_queue, loop  # noqa: E402

timing.patch(loop.Trainer, "run", evals=("_validate",), saves=("_save", "_prune_best"))
# since 2026-12-04 the checkpoint files are written on a thread (train/file_queue.py): the run's last wait for them
timing.exclude(file_queue.FileQueue, "close")
sys.argv = ["src/run.py", *sys.argv[1:]]
runpy.run_path("src/run.py", run_name="__main__")

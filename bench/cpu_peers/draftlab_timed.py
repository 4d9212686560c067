"""draftlab's `src/run.py`, unchanged, with `Trainer.run` timed (minus validation passes and checkpoint writes inside it).
Run from the tree to measure (its src/ first on PYTHONPATH)."""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402
from draftlab.train import loop  # noqa: E402

timing.patch(loop.Trainer, "run", evals=("_validate",), saves=("_save", "_prune_best"))
sys.argv = ["src/run.py", *sys.argv[1:]]
runpy.run_path("src/run.py", run_name="__main__")

"""draftlab's train stage on an extract folder, timed (timing.py): what `src/run.py 'stages=[train]'` runs, without
the pipeline around it (stage keys, lock, tracking), so that it also takes a synthetic pool no job produced.

    python benchmarks/peers/draftlab_timed.py EXTRACT_DIR OUT_DIR [overrides...]

Run from the tree to measure, its src/ first on PYTHONPATH: the config is composed from that tree's conf/ with the
overrides, as src/run.py composes it. `Trainer.run` is timed minus the validation passes and checkpoint writes
inside it; the exported draft lands in OUT_DIR/draft (the SGLang folder the stage writes).
"""

import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402
from draftlab.train import file_queue, loop  # noqa: E402

timing.patch(loop.Trainer, "run", evals=("_validate",), saves=("_save", "_prune_best"))
# the checkpoint files are written on a thread (train/file_queue.py): the run's last wait for them
timing.exclude(file_queue.FileQueue, "close")


def main() -> None:
    from draftlab.config.config import compose_conf
    from draftlab.util.reporting import RecordingReporter
    from draftlab.stages import train

    extract, out, overrides = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), sys.argv[3:]
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    # the measured tree's conf/ (its src/ is first on the path); no deployed-tau benches inside the timed training
    cfg = compose_conf(["train.bench_every=null", *overrides])
    metrics = train.run(cfg, out, {"extract": extract}, RecordingReporter())
    logging.getLogger("draftlab").info("train: val/loss %.4f after %d steps", metrics.get("val/loss", float("nan")),
                                       int(metrics.get("train/steps", 0)))


if __name__ == "__main__":
    main()

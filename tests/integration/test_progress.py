"""Progress per batch or step: each stage's bar moves per unit of work, not per shard."""

import pytest

import draftlab.util.progress as progress
from draftlab.task import run_task


class RecordingBar:
    """Stands in for tqdm; keeps what the stage told it."""

    bars: list = []

    def __init__(self, total=None, desc="", unit="", initial=0, **kwargs):
        self.total, self.desc, self.unit, self.n, self.updates = total, desc, unit, initial, []
        RecordingBar.bars.append(self)

    def update(self, n=1):
        self.updates.append(n)
        self.n += n

    def set_postfix(self, **kwargs):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


@pytest.fixture
def bars(monkeypatch):
    import draftlab.stages.extract as extract
    import draftlab.stages.generate as generate

    RecordingBar.bars = []
    monkeypatch.setattr(progress, "tqdm", RecordingBar)
    for module in (generate, extract):  # they imported bar(); point it at the recording one
        monkeypatch.setattr(module, "bar", lambda total, desc, unit, initial=0: RecordingBar(total, desc, unit))
    return RecordingBar.bars


def test_every_stage_reports_per_batch_step_or_prompt(tiny_cfg, bars):
    # one shard of 16 samples in batches of 4: a bar that moved per shard would show one update of 16
    run_task(tiny_cfg("data.samples=16", "data.batch_size=4", "data.shard_size=16", "extract.batch_size=4",
                      "extract.shard_size=16", "data.val_fraction=0.5", "tracking.enabled=false"))
    by_desc = {bar.desc: bar for bar in bars}
    assert by_desc["generate"].updates == [4, 4, 4, 4] and by_desc["generate"].unit == "sample"
    assert by_desc["extract"].updates == [4, 4, 4, 4]
    train = by_desc["train"]
    assert train.unit == "step" and train.total >= 1 and train.n == train.total  # one tick per optimizer step
    # bench.prompts=2 from each of the default sets (the held-out split and humaneval)
    assert by_desc["bench"].updates == [1] * by_desc["bench"].total and by_desc["bench"].total == 2 * 2

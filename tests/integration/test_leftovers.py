"""No leftovers: temporary folders are removed on failure and cleaned at the next start, and a
disk-full error names the file being written."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO
from draftlab.util import fsutil
from draftlab.target import target


class FakeGGUFModel:
    """Stands in for the 135M model: only the conversion's file handling is under test."""

    def __init__(self, fail: bool):
        self.config, self.fail = SimpleNamespace(), fail

    def save_pretrained(self, folder):
        (Path(folder) / "model.safetensors").write_bytes(b"x" * 4096)
        if self.fail:
            raise OSError(errno.ENOSPC, "No space left on device")
        (Path(folder) / "config.json").write_text("{}")


@pytest.fixture
def fake_transformers(monkeypatch):
    import transformers

    state = {"fail": True}
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: FakeGGUFModel(state["fail"]))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: SimpleNamespace(save_pretrained=lambda folder: None))
    return state


def test_gguf_conversion_leaves_nothing_on_failure_and_cleans_stale_ones(tmp_path, fake_transformers):
    folder = target._smollm2_folder(tmp_path)
    stale = tmp_path / f".{folder.name}-killed"  # what a kill -9 during an earlier conversion left
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"x" * 4096)
    with pytest.raises(OSError):
        target._embedded_smollm2(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{folder.name}.lock"]
    fake_transformers["fail"] = False
    assert target._embedded_smollm2(tmp_path) == folder and (folder / "config.json").exists()
    assert not list(tmp_path.glob(".smollm2-*"))


def test_checkpoint_tmp_folder_removed_on_failure_and_at_next_start(tiny_cfg, tmp_path, monkeypatch):
    from draftlab.config.config import validate
    from draftlab.pipeline import plan, run_stages
    from draftlab.util.reporting import NullReporter

    cfg = validate(tiny_cfg("train.checkpoint_every=1"))
    run_stages(cfg, NullReporter(), names=["generate", "extract"])
    ckpts = plan(cfg)["train"].folder / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / ".ckpt-000000001-e0000-b000000001.tmp").mkdir()  # left by a kill during a save
    real_save = fsutil.atomic_save_safetensors
    saves = []

    def disk_full_on_second_save(path, tensors, metadata=None):
        saves.append(path)
        if len(saves) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_save(path, tensors, metadata)

    monkeypatch.setattr(fsutil, "atomic_save_safetensors", disk_full_on_second_save)
    with pytest.raises(OSError, match="No space left"):
        run_stages(cfg, NullReporter(), names=["train"])
    assert saves and saves[0].parent.name.endswith(".tmp")
    assert not list(ckpts.glob(".ckpt-*")), list(ckpts.iterdir())


def test_disk_full_names_the_file(tmp_path):
    """A real write failure: the file-size limit makes the kernel refuse the write, as a full disk would."""
    script = textwrap.dedent(f"""
        import resource, signal, torch
        from draftlab.util import fsutil
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        for write in (lambda p: fsutil.atomic_save_safetensors(p, {{"x": torch.zeros(100000)}}),
                      lambda p: fsutil.atomic_write_text(p, "y" * 100000)):
            try:
                write({str(tmp_path / 'shard-00000.safetensors')!r})
            except OSError as err:
                print("ERR", err)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    errors = [line for line in out.stdout.splitlines() if line.startswith("ERR")]
    assert len(errors) == 2, out.stdout + out.stderr
    assert all(str(tmp_path / "shard-00000.safetensors") in line for line in errors), errors
    assert not list(tmp_path.iterdir())  # and no temporary file is left

"""Atomic writes leave files as a plain open() would, and the samples' texts read back whatever they hold."""

import os
import stat

import torch

from draftlab.data.samples import Sample, read_samples, write_samples
from draftlab.util import fsutil
from draftlab.util.fsutil import atomic_write_text


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_an_atomic_write_gets_the_mode_of_a_plain_write(tmp_path, monkeypatch):
    atomic_write_text(tmp_path / "atomic.txt", "x")
    (tmp_path / "plain.txt").write_text("x")
    assert _mode(tmp_path / "atomic.txt") == _mode(tmp_path / "plain.txt")
    monkeypatch.setattr(fsutil, "_UMASK", 0o022)  # the usual umask, whatever this process runs under
    atomic_write_text(tmp_path / "shared.txt", "x")
    assert _mode(tmp_path / "shared.txt") == 0o644  # not mkstemp's 0600


def test_texts_with_unicode_line_breaks_read_back_whole(tmp_path):
    texts = ["a\u2028b", "c\x1cd\x85e", "f\r\ng"]
    samples = [Sample(i, torch.tensor([1, 2, 3]), torch.tensor([False, True, True]), "train", text, text, f"c{i}")
               for i, text in enumerate(texts)]
    write_samples(tmp_path, samples)
    assert [s.prompt for s in read_samples(tmp_path, with_text=True)] == texts

"""benchmarks/gpu/pool_prefix.py and data_scaling.sh's pool.tgz: one machine's validation answers, staged for the
next. A pool generated again answers the validation set again (docs/tracking.md); a staged prefix keeps its answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import benchmark_script
from draftlab.data.samples import Sample, read_manifest, read_samples, write_samples

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu" / "data_scaling.sh"


def pool(folder: Path, n: int = 8, shard_size: int = 3) -> Path:
    samples = [Sample(i, torch.arange(i, i + 5), torch.tensor([False, False, True, True, True]),
                      "val" if i < 2 else "train", f"prompt {i}", f"answer {i}", f"c{i}") for i in range(n)]
    write_samples(folder, samples, fingerprint="fp-pool", shard_size=shard_size)
    return folder


def fields(samples) -> list[tuple]:
    return [(s.index, s.split, s.prompt, s.response, s.conversation_id, s.input_ids.tolist(), s.loss_mask.tolist())
            for s in samples]


def test_the_prefix_is_the_pools_first_shards_under_its_fingerprint(tmp_path):
    write_prefix = benchmark_script("gpu/pool_prefix").write_prefix
    source = pool(tmp_path / "generate" / "abc123")  # shards of 3, 3 and 2 samples
    target = write_prefix(source, tmp_path / "out", 2)
    assert target == tmp_path / "out" / "abc123" and read_manifest(target)["fingerprint"] == "fp-pool"
    assert read_manifest(target)["shards"] == read_manifest(source)["shards"][:2]
    got = fields(read_samples(target, with_text=True))
    assert len(got) == 6 and got == fields(read_samples(source, limit=6, with_text=True))
    with pytest.raises(FileExistsError):
        write_prefix(source, tmp_path / "out", 1)
    with pytest.raises(ValueError, match="--shards 4: .* holds 3 shards"):
        write_prefix(source, tmp_path / "other", 4)
    one_each = pool(tmp_path / "generate" / "one", shard_size=1)
    with pytest.raises(ValueError, match="the validation set goes on past sample 1"):  # samples 0 and 1 are val
        write_prefix(one_each, tmp_path / "other", 1)
    assert not (tmp_path / "other").exists()  # refused before anything is written


def test_collect_sends_the_prefix_and_install_puts_it_under_the_next_machines_pool(tmp_path):
    """One machine's collect writes $OUT/pool.tgz; the next has it staged as .gpu-stage/pool/ and its jobs' pool
    starts with the same samples."""
    first, second, out, tree = (tmp_path / name for name in ("g1", "g2", "out", "tree"))
    for g in (first, second):  # the code copy install makes, without benchmarks/results
        subprocess.run(["bash", str(SCRIPT), "gpu_code_copy", str(g)], cwd=REPO, check=True)
    records = Path("benchmarks", "results", "data_scaling", "records.jsonl.gz")
    (tree / records).parent.mkdir(parents=True)
    (tree / records).symlink_to(REPO / records)  # the repository root holds the records; the code copy does not
    source = pool(first / "dl" / "generate" / "abc123", n=4096, shard_size=1024)
    out.mkdir()
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(out), "HOME": str(tmp_path),
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(["bash", str(SCRIPT), "collect"], env={**env, "G": str(first)}, cwd=tree, check=True,
                          capture_output=True, text=True)
    # its validation answers (indices 0 and 1, 3 loss positions each) against the committed runs'
    assert "pool: validation answers of other lengths than the committed runs':" in done.stdout
    (tree / ".gpu-stage" / "pool").mkdir(parents=True)
    (out / "pool.tgz").rename(tree / ".gpu-stage" / "pool" / "pool.tgz")
    done = subprocess.run(["bash", str(SCRIPT), "install_pool"], env={**env, "G": str(second)}, cwd=tree,
                          check=True, capture_output=True, text=True)
    assert "pool: abc123 carried" in done.stdout
    got = fields(read_samples(second / "dl" / "generate" / "abc123", with_text=True))
    assert len(got) == 1024 and got == fields(read_samples(source, limit=1024, with_text=True))  # the first shard
    subprocess.run(["bash", str(SCRIPT), "collect"], env={**env, "G": str(second)}, check=True, capture_output=True)
    assert not (out / "pool.tgz").exists()  # a staged pool is not sent back again


def test_compare_counts_validation_answers_of_other_lengths(tmp_path):
    """Each answer has 3 loss positions; a run scored on these answers matches, one scored on others does not."""
    module = benchmark_script("gpu/pool_prefix")
    source = pool(tmp_path / "generate" / "abc123")
    records = tmp_path / "records.jsonl"
    lines = ['{"run_id": "same", "val_samples": {"index": [0, 1], "tokens": [3, 3]}}',
             '{"run_id": "again", "val_samples": {"index": [0, 1], "tokens": [3, 7]}}', '{"run_id": "none"}']
    records.write_text("\n".join(lines) + "\n")
    assert module.compare(source, records) == [("same", 2, 0), ("again", 2, 1)]
    assert module.main([str(source), "--compare", str(records)]) == 0
    with pytest.raises(SystemExit):
        module.main([str(source)])  # neither OUT nor --compare


def test_a_staged_pool_the_jobs_did_not_extend_is_dropped_with_a_warning(tmp_path):
    """Another generate key (other code or settings) makes the jobs a pool of their own: the staged one is not
    theirs, is said so, and gives way to the machine's own pool.tgz."""
    (tmp_path / "code").symlink_to(REPO)
    (tmp_path / "dl" / "generate" / "abc123").mkdir(parents=True)
    (tmp_path / "dl" / "generate" / "abc123" / "manifest.json").write_text("{}")
    (tmp_path / "dl" / "generate" / "abc123.lock").touch()  # the pipeline's lock beside the stage folder
    (tmp_path / "pool-carried").write_text("abc123\n")
    env = {"G": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["bash", str(SCRIPT), "check_carried"], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "the jobs extend the carried abc123" in done.stdout
    (tmp_path / "dl" / "generate" / "def456").mkdir()
    (tmp_path / "dl" / "generate" / "def456" / "manifest.json").write_text("{}")
    done = subprocess.run(["bash", str(SCRIPT), "check_carried"], env=env, capture_output=True, text=True)
    assert "WARNING: the jobs made their own pool, not the carried abc123" in done.stdout
    assert sorted(p.name for p in (tmp_path / "dl" / "generate").iterdir()) == ["def456"]
    assert not (tmp_path / "pool-carried").exists()

"""The GPU serve job's overrides compose and validate here, so a misspelt key costs a test, not device time."""

import subprocess
import tarfile
from pathlib import Path

import pytest

from draftlab.config.config import ConfigError, check_overrides, compose_conf, validate

ROOT = Path(__file__).resolve().parents[2]
SERVE_SH = ROOT / "benchmarks" / "gpu" / "serve.sh"


def job_overrides(tmp_path: Path, **env: str) -> list[str]:
    env = {"G": str(tmp_path), "PATH": "/usr/bin:/bin", **env}
    out = subprocess.run(["bash", str(SERVE_SH), "overrides"], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if line]


# what the job adds: the fallback without CUDA graphs; the stages of a training-only and a bench-only job
@pytest.mark.parametrize("mode,extra,stages", [
    ({}, [], ["generate", "extract", "train", "bench"]),
    ({}, ["serve.cuda_graph=false"], ["generate", "extract", "train", "bench"]),
    ({"TRAIN_ONLY": "1"}, ["train.bench_every=1000"], ["generate", "extract", "train"]),
    ({"BENCH_ONLY": "1"}, ["train.bench_every=1000"], ["generate", "bench"])])
def test_serve_job_overrides_compose(tmp_path, mode, extra, stages):
    args = job_overrides(tmp_path, **mode) + extra
    check_overrides(args)
    cfg = validate(compose_conf(args))
    assert cfg.serve.backend == "both" and cfg.data.samples == 50000
    assert cfg.paths.root == str(tmp_path / "root")
    assert list(cfg.bench.sglang_grid) == [[3, 1], [4, 2, 8]]
    assert list(cfg.stages) == stages


def test_a_misspelt_job_key_is_refused(tmp_path):
    args = job_overrides(tmp_path) + ["serve.cuda_grph=false"]
    with pytest.raises(ConfigError, match="cuda_grph"):
        check_overrides(args)


def test_collect_brings_back_the_completed_train_folder_without_checkpoints(tmp_path):
    g, out = tmp_path / "g", tmp_path / "out"
    folder = g / "root" / "train" / "0123abcd"
    for name in ("draft/model.safetensors", "checkpoints/step-100.pt", "metrics.json"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x" * 1000)
    (g / "code").mkdir()
    out.mkdir()
    env = {"G": str(g), "OUT": str(out), "DRAFT": "1", "PATH": "/usr/bin:/bin"}
    subprocess.run(["bash", str(SERVE_SH), "collect"], cwd=ROOT, env=env, check=True, capture_output=True)
    assert not list(out.glob("train.tgz.part-*")), "packed before training wrote its completion record"

    (folder / ".done").mkdir()
    (folder / ".done" / "0123abcd.json").write_text("{}")
    subprocess.run(["bash", str(SERVE_SH), "collect"], cwd=ROOT, env=env, check=True, capture_output=True)
    parts = sorted(out.glob("train.tgz.part-*"))
    joined = tmp_path / "train.tgz"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as tar:
        names = set(tar.getnames())
    assert "train/0123abcd/draft/model.safetensors" in names and "train/0123abcd/.done/0123abcd.json" in names
    assert not any("checkpoints" in n for n in names)

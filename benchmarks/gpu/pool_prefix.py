"""The first shards of a generate pool as a pool of their own: the fixed validation set and the training samples
answered with it, small enough to copy off one machine and onto the next.

A machine that generates its pool again answers the validation set again, and greedy answers made again can
differ (docs/tracking.md): runs of two machines are then scored on two validation sets. A machine that starts from
this prefix extends it (the generate stage makes only the missing samples), so its runs score on the same answers.
Whole shards, copied as they are: the stage extends a pool shard by shard, so the shards after a whole-shard
prefix are cut where an uninterrupted run cuts them, and nothing is parsed or written again.

    python benchmarks/gpu/pool_prefix.py POOL OUT [--shards 1]   # writes OUT/<POOL's folder name>/
    python benchmarks/gpu/pool_prefix.py POOL --compare RECORDS   # its validation answers against the runs'

`--compare` reads the per-sample token counts of each run in RECORDS (import-runs --records) and counts the
validation answers whose length differs from the pool's: 0 for every run means the same validation set, as far as
lengths show (docs/tracking.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from draftlab.data.samples import read_manifest, read_samples
from draftlab.util.fsutil import atomic_write_json


def _first_split(pool: Path, shard: dict) -> str:
    """The split of a shard's first sample, from its first text line (the validation set comes first)."""
    with open(pool / f"{shard['name']}.jsonl", encoding="utf-8") as texts:
        return json.loads(texts.readline())["split"]


def write_prefix(pool: Path, out: Path, shards: int = 1) -> Path:
    """OUT/<pool's name>: the pool's first `shards` shards under the pool's fingerprint."""
    manifest = read_manifest(pool)
    if manifest is None:
        raise FileNotFoundError(f"{pool}: no samples manifest.json (did the generate stage run?)")
    if not 1 <= shards <= len(manifest["shards"]):
        raise ValueError(f"--shards {shards}: {pool} holds {len(manifest['shards'])} shards")
    kept = manifest["shards"][:shards]
    samples = sum(shard["samples"] for shard in kept)
    if shards < len(manifest["shards"]) and _first_split(pool, manifest["shards"][shards]) == "val":
        raise ValueError(f"--shards {shards}: the validation set goes on past sample {samples}")
    target = out / pool.name
    if read_manifest(target) is not None:
        raise FileExistsError(f"{target}: a pool is already there")
    target.mkdir(parents=True, exist_ok=True)
    for shard in kept:
        for suffix in (".safetensors", ".jsonl"):
            shutil.copyfile(pool / f"{shard['name']}{suffix}", target / f"{shard['name']}{suffix}")
    prefix = {**manifest, "shards": kept, "num_samples": samples, "tokens": sum(s["tokens"] for s in kept)}
    atomic_write_json(target / "manifest.json", prefix)  # last: a folder without it holds no pool
    return target


def compare(pool: Path, records: Path) -> list[tuple[str, int, int]]:
    """(run id, validation answers both hold, of them how many differ in length) for each run with per-sample
    results; an answer's length is its count of loss positions, the `tokens` of the run's val_samples."""
    from draftlab.analysis.records import read_records  # scipy comes with it: only when comparing

    lengths = {s.index: int(s.loss_mask.sum()) for s in read_samples(pool, split="val")}
    out = []
    for record in read_records(records):
        val = record.get("val_samples") or {}
        shared = [(i, t) for i, t in zip(val.get("index", []), val.get("tokens", [])) if int(i) in lengths]
        if shared:
            out.append((str(record.get("run_id")), len(shared), sum(lengths[int(i)] != int(t) for i, t in shared)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pool", type=Path, help="a generate stage's folder (paths.root/generate/<key>)")
    parser.add_argument("out", type=Path, nargs="?", help="the folder to write <key>/ into")
    parser.add_argument("--compare", type=Path, metavar="RECORDS", help="count validation answers of other lengths")
    parser.add_argument("--shards", type=int, default=1, help="shards to keep (data.val_samples and more)")
    args = parser.parse_args(argv)
    if (args.out is None) == (args.compare is None):
        parser.error("give OUT (write the prefix) or --compare RECORDS, one of them")
    try:
        if args.compare is not None:
            for run_id, shared, differ in compare(args.pool, args.compare):
                print(f"{run_id}: {differ} of {shared} validation answers differ in length")
            return 0
        target = write_prefix(args.pool, args.out, args.shards)
    except (OSError, ValueError) as error:
        print(f"pool_prefix: {error}", file=sys.stderr)
        return 2
    print(f"pool_prefix: {read_manifest(target)['num_samples']} samples of {args.pool} in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

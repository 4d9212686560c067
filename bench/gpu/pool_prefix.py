"""The first samples of a generate pool as a pool of their own: the fixed validation set and the training samples
of the first batch, small enough to come back from a device call and be carried into the next.

A session that generates its pool again answers the validation set again, and greedy answers made again can
differ (docs/tracking.md): runs of two sessions are then scored on two validation sets. A session that starts from
this prefix extends it (the generate stage makes only the missing samples), so its runs score on the same answers.

    python bench/gpu/pool_prefix.py POOL OUT [--samples 2048]   # writes OUT/<POOL's folder name>/
    python bench/gpu/pool_prefix.py POOL --compare RECORDS       # its validation answers against the runs'

`--compare` reads the per-sample token counts of each run in RECORDS (import-runs --records) and counts the
validation answers whose length differs from the pool's: 0 for every run means the same validation set, as far as
lengths show (docs/tracking.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftlab.data.samples import SampleWriter, read_manifest, read_samples


def write_prefix(pool: Path, out: Path, samples: int, batch_size: int) -> Path:
    """OUT/<pool's name>: the pool's first `samples` samples, one shard, under the pool's fingerprint."""
    manifest = read_manifest(pool)
    if manifest is None:
        raise FileNotFoundError(f"{pool}: no samples manifest.json (did the generate stage run?)")
    if samples % batch_size:  # the stage extends a pool batch by batch, each batch seeded by its first index
        raise ValueError(f"--samples {samples}: not a multiple of --batch-size {batch_size}")
    if manifest["num_samples"] < samples:
        raise ValueError(f"{pool}: {manifest['num_samples']} samples, fewer than the {samples} asked for")
    target = out / pool.name
    if read_manifest(target) is not None:
        raise FileExistsError(f"{target}: a pool is already there")
    kept = list(read_samples(pool, limit=min(samples + 1, manifest["num_samples"]), with_text=True))
    if len(kept) > samples and kept[samples].split == "val":  # the validation set comes first: keep all of it
        raise ValueError(f"--samples {samples}: the validation set goes on past sample {samples}")
    writer = SampleWriter(target, manifest["fingerprint"], meta=manifest.get("meta"))
    writer.write_shard(kept[:samples])
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
    parser.add_argument("--samples", type=int, default=2048, help="samples to keep (data.val_samples and more)")
    parser.add_argument("--batch-size", type=int, default=2048, help="the pool's data.batch_size")
    args = parser.parse_args(argv)
    if (args.out is None) == (args.compare is None):
        parser.error("give OUT (write the prefix) or --compare RECORDS, one of them")
    try:
        if args.compare is not None:
            for run_id, shared, differ in compare(args.pool, args.compare):
                print(f"{run_id}: {differ} of {shared} validation answers differ in length")
            return 0
        target = write_prefix(args.pool, args.out, args.samples, args.batch_size)
    except (OSError, ValueError) as error:
        print(f"pool_prefix: {error}", file=sys.stderr)
        return 2
    print(f"pool_prefix: {args.samples} samples of {args.pool} in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

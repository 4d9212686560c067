"""How fast the offline reader builds training batches from a pool of many shards, as the headline's is (49 shards of
1,024 samples; a shuffled batch takes its rows from most of them). The reader runs on the trainer's read-ahead
worker; when it is slower than a step, the trainer waits (train/data_wait_frac).

    python benchmarks/read_batches.py                       # this checkout's reader
    python benchmarks/read_batches.py --code /tmp/old       # another checkout's reader (git worktree add /tmp/old REV)

Synthetic SmolLM2-shaped shards (bf16 features of 3 x 576, last_hidden, target_top). Prints one JSON line: ms a
batch for each pass over the same batches (the first pass maps the shards' pages; later passes are the steady state
of a long run), and ms a batch when the trainer's iterator (`FeatureSource.batches`, its read-ahead workers) is
drained by a caller that does nothing else: the fastest the reader can feed a step."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout to import")
ap.add_argument("--samples", type=int, default=4096)
ap.add_argument("--per-shard", type=int, default=64)
ap.add_argument("--seq", type=int, default=200, help="longest sample; lengths are uniform in [seq/2, seq]")
ap.add_argument("--batch-tokens", type=int, default=16384)
ap.add_argument("--batches", type=int, default=40)
ap.add_argument("--passes", type=int, default=3)
ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default, as the trainer)")
ap.add_argument("--read-workers", type=int, default=0,
                help="threads building the read-ahead batches (reader.READ_WORKERS; 0: the code's own)")
args = ap.parse_args()
scripts = args.code / "benchmarks"
if not scripts.is_dir():  # another checkout may keep these scripts in bench/
    scripts = args.code / "bench"
sys.path.insert(0, str(scripts))  # its train_data_path puts its own src first

import torch  # noqa: E402

from train_data_path import synthetic_source  # noqa: E402

try:  # draftlab.data.reader; older codes (--code) kept it in data/features.py
    from draftlab.data import reader  # noqa: E402
except ImportError:
    from draftlab.data import features as reader  # noqa: E402

if args.threads:
    torch.set_num_threads(args.threads)
if args.read_workers:
    reader.READ_WORKERS = args.read_workers
with tempfile.TemporaryDirectory(prefix="read-batches-") as tmp:
    source = synthetic_source(Path(tmp), args.samples, args.seq, per_shard=args.per_shard, prompt_frac=0.4)
    plan = source._plan("train", 0, args.batch_tokens, 2048, 0, True)[: args.batches]
    passes, drained = [], []
    for epoch in range(args.passes):
        start = time.perf_counter()
        for group in plan:
            source._offline_batch(group, 2048)
        passes.append(round((time.perf_counter() - start) / len(plan) * 1e3, 1))
        # the trainer's way: the read-ahead workers of `batches`, drained by a caller that does nothing else
        start, count = time.perf_counter(), 0
        for _ in source.batches("train", epoch, args.batch_tokens, 2048, 0):
            count += 1
        drained.append(round((time.perf_counter() - start) / count * 1e3, 1))
print(json.dumps({"code": str(args.code), "reader": reader.__file__, "shards": len(source.manifest["shards"]),
                  "batches": len(plan), "rows_per_batch": round(sum(len(g) for g in plan) / len(plan), 1),
                  "batch_tokens": args.batch_tokens, "threads": torch.get_num_threads(),
                  "read_workers": getattr(reader, "READ_WORKERS", 1), "ms_per_batch": passes,
                  "ms_per_batch_drained": drained}))

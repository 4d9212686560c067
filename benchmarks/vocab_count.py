"""Times the draft-vocabulary count (`data.vocab.count_tokens`) over a generate pool at a given thread count.

    python benchmarks/vocab_count.py <outputs>/generate/<key> --threads 16 [--per-sample]

`--per-sample` times the old way (one vocabulary-wide add per sample) for comparison (BENCHMARKS.md, "Several
jobs on one host"). Run it beside a busy process to see what oversubscribed threads cost.
"""

import argparse
import time
from pathlib import Path

import torch

from draftlab.data.samples import read_samples
from draftlab.data.vocab import count_tokens


def per_sample(samples, vocab: int) -> torch.Tensor:
    counts = torch.zeros(vocab, dtype=torch.int64)
    for s in samples:
        counts += torch.bincount(s.input_ids[s.loss_mask.bool()].long(), minlength=vocab)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("pool", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--per-sample", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    samples = list(read_samples(args.pool, split="train"))
    start = time.perf_counter()
    counts = per_sample(samples, args.vocab) if args.per_sample else count_tokens(samples, args.vocab)
    print(f"threads={args.threads} per_sample={args.per_sample} samples={len(samples)} "
          f"tokens={int(counts.sum())} seconds={time.perf_counter() - start:.3f}")


if __name__ == "__main__":
    main()

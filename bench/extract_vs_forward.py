"""Extraction cost against a plain target forward over the same batches; goal: extraction <= 1.1x the forward.

Extraction = the extract stage's inner loop exactly (`extract_shard`: hooked forward + per-sample gather + cast to
the storage dtype, then `ShardWriter`: device->host copy + safetensors write on its background thread). Forward =
`model.model(...)` without any capture on the same padded batches (same host-side padding and copies). The two are
run alternately, `--repeats` times each, and the best time of each is compared (robust to a shared machine).

    python bench/extract_vs_forward.py --device cpu --target smollm2 --samples 32 --threads 2
    python bench/extract_vs_forward.py --device cuda --target smollm2 --samples 1024 --batch-size 64

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from draftlab.config import default_config
from draftlab.data.features import HiddenTap, model_mask, pad_batch
from draftlab.data.layers import resolve_layers
from draftlab.data.samples import Sample
from draftlab.stages.extract import ShardWriter, extract_shard
from draftlab.target import load_target


def synthetic_samples(count: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[Sample]:
    """Random token sequences of ShareGPT-like lengths: forward cost does not depend on which tokens they are."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (count,), generator=gen).tolist()
    samples = []
    for i, n in enumerate(lengths):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[n // 3:] = True
        samples.append(Sample(i, torch.randint(3, vocab, (n,), generator=gen), mask, "train"))
    return samples


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_forward(target, shards: list[list[Sample]], batch_size: int) -> None:
    """The same batches as `extract_shard` makes (sorted by length inside a shard), without capture or storage."""
    with torch.inference_mode():
        for shard in shards:
            order = sorted(shard, key=lambda s: len(s.input_ids))
            for start in range(0, len(order), batch_size):
                seqs = [s.input_ids for s in order[start:start + batch_size]]
                ids, mask = pad_batch(seqs)
                mask = model_mask(seqs, mask)
                target.model.model(input_ids=ids.to(target.device),
                                   attention_mask=None if mask is None else mask.to(target.device), use_cache=False)
    sync(target.device)


def extraction(target, tap, shards, batch_size: int, dtype: torch.dtype, folder: Path) -> int:
    manifest = {"shards": [], "num_samples": 0}
    writer = ShardWriter(folder, manifest)
    try:
        for shard in shards:
            writer.submit(extract_shard(tap, shard, batch_size, dtype, target.device), 0.0)
    finally:
        writer.close()  # waits for the last write: its device->host copy syncs the device
    return manifest["bytes"]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--target", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--dtype", default="bfloat16", help="target compute dtype")
    parser.add_argument("--store-dtype", default="bfloat16", help="extract.dtype")
    parser.add_argument("--layers", default="auto")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=128)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8, help="extract.batch_size")
    parser.add_argument("--shard-size", type=int, default=16, help="extract.shard_size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument("--root", default="outputs", help="paths.root (the converted SmolLM2 is cached there)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = default_config({"target": {"name": args.target, "device": args.device, "dtype": args.dtype},
                          "paths": {"root": args.root}})
    target = load_target(cfg.target, Path(args.root) / "models")
    layer_ids = resolve_layers(args.layers, target.num_layers)
    tap = HiddenTap(target.model, layer_ids)
    samples = synthetic_samples(args.samples, args.min_len, args.max_len, target.vocab_size, seed=0)
    shards = [samples[i:i + args.shard_size] for i in range(0, len(samples), args.shard_size)]
    store = getattr(torch, args.store_dtype)
    tokens = sum(len(s.input_ids) for s in samples)
    with tempfile.TemporaryDirectory(prefix="extract-bench-", dir=args.root if Path(args.root).exists() else None) \
            as tmp:
        plain_forward(target, shards[:1], args.batch_size)  # warm-up: kernels, allocator, first-touch pages
        extraction(target, tap, shards[:1], args.batch_size, store, Path(tmp))
        forward_s, extract_s, written = [], [], []
        for _ in range(args.repeats):  # alternate so that load on a shared machine hits both alike
            forward_s.append(timed(lambda: plain_forward(target, shards, args.batch_size)))
            extract_s.append(timed(lambda: written.append(
                extraction(target, tap, shards, args.batch_size, store, Path(tmp)))))
    best_f, best_e = min(forward_s), min(extract_s)
    print(json.dumps({
        "device": args.device, "target": args.target, "dtype": args.dtype, "store_dtype": args.store_dtype,
        "layer_ids": layer_ids, "samples": args.samples, "tokens": tokens, "batch_size": args.batch_size,
        "threads": torch.get_num_threads(), "forward_tok_s": round(tokens / best_f, 1),
        "extract_tok_s": round(tokens / best_e, 1), "ratio": round(best_e / best_f, 3),
        "ratio_median": round(sorted(extract_s)[len(extract_s) // 2] / sorted(forward_s)[len(forward_s) // 2], 3),
        "forward_s": [round(t, 3) for t in forward_s], "extract_s": [round(t, 3) for t in extract_s],
        "bytes_per_token": round(written[-1] / tokens, 1), "goal_ratio": 1.1,
    }))


if __name__ == "__main__":
    main()

"""Extraction cost against a plain target forward over the same batches; goal: extraction <= 1.1x the forward.

Extraction = the extract stage's inner loop exactly (`extract_shard`: hooked forward + per-sample gather + cast to
the storage dtype + the full-vocabulary top-1, then `ShardWriter`: device->host copy + safetensors writes on its
background threads). Forward = `model.model(...)` without any capture on batches cut the same way (same host-side
padding and copies) and with the stage's attention kernels (draftlab.model.attention). Variants, each timed in turn
`--repeats` times, each repeat starting one variant later (best and median tok/s kept, and each repeat's forward
over the same repeat's variant, `ratios_paired`: robust to a shared machine), so that the cost splits into its
parts. Beside each run, the host's load over it (`host_load_runs`: the CPU time stolen by the hypervisor and busy,
and a fixed Python loop's time before and after: benchmarks/host_load.py).
Every timed run draws samples of its own (same count and length range), as the stage rarely sees a shape twice;
`--same-shapes` reuses one set, which hid cuDNN's per-shape planning until 2026-12-02 (BENCHMARKS.md).
`--samples-from` takes a generate stage's samples instead (real lengths and answer masks, e.g. a headline's): timed
run k then reads the k-th window of `--samples` of them, wrapping around (windows repeat once the folder is used up;
the stage's kernels do not plan per shape, so a repeated window costs what a new one does).
  forward        the target's body alone (the goal's baseline)
  forward_cudnn  the same with PyTorch's own kernel choice (cuDNN's attention on an H200; CUDA only)
  forward_head   plus the full-vocabulary argmax (`head_top1`) at every position (what a causal LM's forward adds)
  forward_read   plus that argmax only where training reads it (`stored_top1`, as extraction stores `target_top`)
  extract_host   extraction with the shards copied to pinned host memory and dropped: no file written
  extract_null   the stage's `ShardWriter` (its threads, events and buffers in flight) with the write left out: with
                 extract_host and extract_shm it splits the write's share into the writer's pipeline and the file
                 (the file: about the last shard's write, which nothing overlaps; BENCHMARKS.md, 2026-12-04)
  extract        the stage's loop writing to --root's disk
  extract_shm    the same into /dev/shm (`--shm`): the write without the disk (the GPU preset's pool)
  extract_shm_raw  the same bytes into /dev/shm with a plain file write instead of safetensors' (`--shm`; not a
                 readable shard): whether the serialiser or the file itself costs
  extract_wN, extract_shm_wN   the same with N writer threads (`--writers 1 4`: extract.writers)
Each writing variant writes into a folder of its own, cleared after its timer.

    python benchmarks/extract_vs_forward.py --device cpu --target smollm2 --samples 32 --threads 2
    python benchmarks/extract_vs_forward.py --device cuda --target shaped --samples 8192 --batch-size 64 \
        --shard-size 1024 --shm --writers 1 4 --root /tmp/dl

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import host_load  # benchmarks/, beside this script
from draftlab.model.attention import variable_shape_attention
from draftlab.config.config import default_config
from draftlab.data.features import HiddenTap, head_top1, model_mask, pad_batch, stored_top1
from draftlab.data.layers import resolve_layers
from draftlab.data.samples import Sample, read_samples
from draftlab.stages.extract import ShardWriter, extract_shard, length_batches, start_host_copy
from draftlab.target.target import load_target


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


def real_samples(folder: Path, count: int) -> list[Sample]:
    """All of a generate folder's samples, refused when fewer than one run needs."""
    samples = list(read_samples(folder))
    if len(samples) < count:
        raise SystemExit(f"--samples-from {folder}: {len(samples)} samples, fewer than --samples {count}")
    return samples


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_forward(target, shards: list[list[Sample]], batch_size: int, head: str = "",
                  cudnn: bool = False) -> None:
    """The same batches as `extract_shard` makes (`length_batches` inside a shard), without capture or storage.
    `head`: "all", plus the full-vocabulary argmax of every position (what a causal LM's forward would add); "read",
    only where training reads it. `cudnn`: PyTorch's own choice of attention kernel (cuDNN on an H200), which the
    stage leaves out."""
    weight = target.model.get_output_embeddings().weight
    with torch.inference_mode(), (contextlib.nullcontext() if cudnn else variable_shape_attention()):
        for shard in shards:
            for indices in length_batches([len(s.input_ids) for s in shard], batch_size):
                chunk = [shard[i] for i in indices]
                seqs = [s.input_ids for s in chunk]
                ids, mask = pad_batch(seqs)
                mask = model_mask(seqs, mask)
                out = target.model.model(input_ids=ids.to(target.device),
                                         attention_mask=None if mask is None else mask.to(target.device),
                                         use_cache=False)
                if head == "all":
                    head_top1(out.last_hidden_state, weight)
                elif head == "read":
                    stored_top1(out.last_hidden_state, weight, [s.loss_mask for s in chunk])
    sync(target.device)


def copied(host: dict, events: list) -> int:
    """Waits for a shard's device->host copies (`start_host_copy`'s events); returns the shard's bytes."""
    for event in events:
        event.synchronize()
    return sum(t.numel() * t.element_size() for t in host.values())


class NullWriter(ShardWriter):
    """The stage's writer, its pipeline whole (copies started on submit, a thread waiting on their events, `writers`
    + 1 shards of pinned buffers alive, the manifest recorded in order) but no shard file: `_write` returns the bytes
    it would have written."""

    @staticmethod
    def _write(path: Path, host: dict, events: list) -> int:
        return copied(host, events)


class RawWriter(ShardWriter):
    """The stage's writer with each tensor's bytes written by a plain `write` (the GIL released for each), not by
    safetensors: the same bytes, in no format any reader takes."""

    @staticmethod
    def _write(path: Path, host: dict, events: list) -> int:
        copied(host, events)
        with open(path, "wb") as handle:
            for t in host.values():
                handle.write(memoryview(t.contiguous().view(torch.uint8).numpy()))
        return path.stat().st_size


def extraction(target, tap, shards, batch_size: int, dtype: torch.dtype, folder: Path | None,
               writers: int = 1, writer_class: type[ShardWriter] = ShardWriter) -> int:
    """The stage's loop; `folder` None: the shards are copied to the host (pinned, side stream) and dropped."""
    if folder is None:
        return sum(copied(*start_host_copy(extract_shard(tap, shard, batch_size, dtype, target.device)))
                   for shard in shards)
    manifest = {"shards": [], "num_samples": 0}
    writer = writer_class(folder, manifest, writers)
    try:
        for shard in shards:
            writer.submit(extract_shard(tap, shard, batch_size, dtype, target.device), 0.0)
    finally:
        writer.close()  # waits for the last write: its device->host copy syncs the device
    return manifest["bytes"]


def clear(folder: Path | None) -> None:
    """A writing variant's shards removed, outside its timer: deleting ~7 GB from tmpfs takes about 0.5 s, which a
    timed run that cleared its folder first would count as its own."""
    for old in folder.glob("shard-*") if folder else ():
        old.unlink()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def shaped_target(device: str, dtype: torch.dtype):
    """A random Llama of SmolLM2-135M's shape: the same cost as the real one without its 98 MB GGUF."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftlab.target.target import Target, config_fingerprint

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    return Target(model, None, "shaped", config_fingerprint("shaped", config.to_dict()), torch.device(device), dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--target", choices=("smollm2", "shaped", "tiny"), default="smollm2",
                        help="shaped: a random Llama of SmolLM2's shape")
    parser.add_argument("--dtype", default="bfloat16", help="target compute dtype")
    parser.add_argument("--store-dtype", default="bfloat16", help="extract.dtype")
    parser.add_argument("--layers", default="auto")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--samples-from", default=None, help="a generate folder: its samples, not synthetic ones")
    parser.add_argument("--min-len", type=int, default=128)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8, help="extract.batch_size")
    parser.add_argument("--shard-size", type=int, default=16, help="extract.shard_size")
    parser.add_argument("--shm", action="store_true", help="also write the shards to /dev/shm (memory, no disk)")
    parser.add_argument("--writers", type=int, nargs="+", default=[1],
                        help="writer thread counts for the variants that write (extract.writers)")
    parser.add_argument("--same-shapes", action="store_true",
                        help="every timed run on the same samples (as before 2026-12-02): per-shape plans amortise")
    parser.add_argument("--no-disk", action="store_true",
                        help="leave out `extract`: the disk's write-back then slows no other variant")
    parser.add_argument("--variants", nargs="+", default=None,
                        help="only these variants (names as printed; forward always runs: the ratios' base)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument("--root", default="outputs", help="paths.root (the converted SmolLM2 is cached there)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if args.target == "shaped":
        target = shaped_target(args.device, dtype)
    else:
        cfg = default_config({"target": {"name": args.target, "device": args.device, "dtype": args.dtype},
                              "paths": {"root": args.root}})
        target = load_target(cfg.target, Path(args.root) / "models")
    layer_ids = resolve_layers(args.layers, target.num_layers)
    tap = HiddenTap(target.model, layer_ids)
    store = getattr(torch, args.store_dtype)

    real = real_samples(Path(args.samples_from), args.samples) if args.samples_from else None

    def shards_of(seed: int) -> list[list[Sample]]:
        if real is None:
            samples = synthetic_samples(args.samples, args.min_len, args.max_len, target.vocab_size, seed)
        else:  # the seed-th window, wrapping: each timed run its own samples while the folder lasts
            start = seed * args.samples
            samples = [real[(start + i) % len(real)] for i in range(args.samples)]
        return [samples[i:i + args.shard_size] for i in range(0, len(samples), args.shard_size)]

    with contextlib.ExitStack() as stack:
        def folder(prefix: str, where: str | None) -> Path:
            return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix, dir=where)))

        disk_root = args.root if Path(args.root).exists() else None
        disk = folder("extract-warm-", disk_root)
        # where each extraction variant writes its shards (None: nowhere); extract_null writes only its manifest
        places = {"extract_host": None, "extract_null": ("extract-null-", None)}
        if not args.no_disk:
            places["extract"] = ("extract-bench-", disk_root)
        if args.shm:
            places["extract_shm"] = ("extract-bench-", "/dev/shm")
            places["extract_shm_raw"] = ("extract-raw-", "/dev/shm")
        written: list[int] = []
        variants = {"forward": lambda shards: plain_forward(target, shards, args.batch_size),
                    "forward_head": lambda shards: plain_forward(target, shards, args.batch_size, head="all"),
                    "forward_read": lambda shards: plain_forward(target, shards, args.batch_size, head="read")}
        if args.device == "cuda":
            variants["forward_cudnn"] = lambda shards: plain_forward(target, shards, args.batch_size, cudnn=True)
        folders: dict[str, Path | None] = {}  # a folder of its own for each writing variant
        for name, place in places.items():
            for writers in ([1] if place is None else args.writers):
                variant = name if writers == 1 else f"{name}_w{writers}"
                writer_class = {"extract_null": NullWriter, "extract_shm_raw": RawWriter}.get(name, ShardWriter)
                folders[variant] = None if place is None else folder(*place)
                variants[variant] = functools.partial(lambda folder, writers, writer_class, shards: written.append((
                    extraction(target, tap, shards, args.batch_size, store, folder, writers, writer_class),
                    sum(len(s.input_ids) for shard in shards for s in shard))), folders[variant], writers,
                    writer_class)
        if args.variants:
            unknown = set(args.variants) - set(variants)
            if unknown:
                parser.error(f"--variants: no variant {sorted(unknown)}; there are {sorted(variants)}")
            variants = {name: fn for name, fn in variants.items() if name == "forward" or name in args.variants}
        warm = shards_of(10**6)[:1]
        plain_forward(target, warm, args.batch_size)  # warm-up: kernels, allocator, first-touch pages
        extraction(target, tap, warm, args.batch_size, store, disk)
        clear(disk)
        os.sync()  # nothing of the warm-up's write-back left to slow the first timed variant
        rates: dict[str, list[float]] = {name: [] for name in variants}
        loads: dict[str, list[dict]] = {name: [] for name in variants}
        seeds = iter(range(1, 10**6))
        fixed = shards_of(0)
        names = list(variants)
        for repeat in range(args.repeats):  # alternate so that load on a shared machine hits every variant alike,
            # each repeat starting one variant later, so that no variant always runs first or right after another
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                # The stage's batch shapes vary, so by default a timed run here does not reuse the last one's: a
                # kernel that plans per shape (cuDNN's attention) pays in the bench as in the stage.
                shards = fixed if args.same_shapes else shards_of(next(seeds))
                tokens = sum(len(s.input_ids) for shard in shards for s in shard)
                before = host_load.snapshot()
                rates[name].append(tokens / timed(functools.partial(variants[name], shards)))
                loads[name].append(host_load.shares(before, host_load.snapshot()))
                clear(folders.get(name))
    best = {name: max(r) for name, r in rates.items()}
    median = {name: statistics.median(r) for name, r in rates.items()}
    # each repeat's forward against the same repeat's variant: a slow stretch of the host hits both
    paired = {name: [f / v for f, v in zip(rates["forward"], r)] for name, r in rates.items()}  # in repeat order
    main_name = next((name for name in ("extract", "extract_host") if name in best), list(best)[-1])
    print(json.dumps({
        "device": args.device, "target": args.target, "dtype": args.dtype, "store_dtype": args.store_dtype,
        "layer_ids": layer_ids, "samples": args.samples, "tokens": sum(len(s.input_ids) for f in fixed for s in f),
        "batch_size": args.batch_size, "shard_size": args.shard_size, "same_shapes": args.same_shapes,
        "samples_from": args.samples_from,
        "threads": torch.get_num_threads(),
        "safetensors": importlib.metadata.version("safetensors"), "torch": torch.__version__,
        "main_variant": main_name, "forward_tok_s": round(best["forward"], 1),
        "extract_tok_s": round(best[main_name], 1),
        "ratio": round(best["forward"] / best[main_name], 3),
        "ratio_median": round(median["forward"] / median[main_name], 3),
        "ratios_to_forward": {name: round(best["forward"] / best[name], 3) for name in variants},
        "tok_s": {name: round(best[name], 1) for name in variants},
        "tok_s_median": {name: round(median[name], 1) for name in variants},
        "tok_s_runs": {name: [round(r, 1) for r in runs] for name, runs in rates.items()},
        "ratios_paired": {name: [round(r, 3) for r in ratios] for name, ratios in paired.items()},
        "ratio_paired_median": {name: round(statistics.median(ratios), 3) for name, ratios in paired.items()},
        "host_load_runs": loads,
        "bytes_per_token": round(written[-1][0] / written[-1][1], 1) if written else None, "goal_ratio": 1.1,
    }))


if __name__ == "__main__":
    main()

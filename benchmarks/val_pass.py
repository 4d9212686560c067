"""A validation pass with the plan by length (today's) against the plan in index order (before): the trainer's own
`evaluate` on a synthetic pool whose lengths are drawn like the headline's (`train_data_path.headline_lengths`),
every sample in the validation split.

    python benchmarks/val_pass.py --device cpu --samples 400 --batch-tokens 16384 --passes 3

The variants alternate, each pass timed whole (on CUDA after a synchronize); the first pass of each is left out
(compiles, allocator, the validation cache's fill). Prints one JSON line per variant: batches, padded positions
over real tokens, seconds a pass (each), and val/loss, which must agree between the two: same samples, other
grouping, so in fp32 on the CPU only the sums' order differs (1e-5 relative); on CUDA in bf16 other batch shapes
take other kernels (1e-3).

On the CPU the trainer's packed unroll computes real tokens only, so padding costs little there; on a GPU the
batches are unrolled padded to buckets, where the plan by length should pay. `--compile-validation` runs validation
as the headline does (its compiled graph; `benchmarks/trainer_speed.py`'s flag).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from train_data_path import V, headline_lengths, smollm2_draft, synthetic_source  # benchmarks/: puts src/ on the path

from draftlab.data import reader
from draftlab.util.reporting import RecordingReporter
from draftlab.train.loop import LoopSettings, Trainer

plan_by_length = reader.plan_batches


def plan_in_index_order(lengths, batch_tokens, seed, epoch, shuffle, window_size=reader.PLAN_WINDOW):
    """The plan in index order, as the reader once cut it: samples in index order, cut at the token budget."""
    if shuffle:
        return plan_by_length(lengths, batch_tokens, seed, epoch, shuffle, window_size)
    return reader.cut_batches(range(len(lengths)), lengths, batch_tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--passes", type=int, default=3, help="timed passes of each variant, after one untimed")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--compile-validation", action="store_true", help="validation's compiled graph (GPU)")
    ap.add_argument("--cuda-graphs", action="store_true", help="train.compile_cuda_graphs: batches padded to buckets")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths, _ = headline_lengths(args.samples)
    variants = {"by_length": plan_by_length, "index_order": plan_in_index_order}
    settings = LoopSettings(max_steps=1, epochs=None, batch_tokens=args.batch_tokens, device=args.device,
                            compile_cuda_graphs=args.cuda_graphs)
    results = {}
    for name, plan in variants.items():  # the plans' shapes, from the lengths alone
        groups = plan(lengths, args.batch_tokens, 0, 0, False)
        padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
        results[name] = {"seconds": [], "batches": len(groups), "padded_x": round(padded / sum(lengths), 3)}
    cuda = args.device == "cuda"
    with tempfile.TemporaryDirectory(prefix="val-pass-") as tmp:
        source = synthetic_source(Path(tmp), args.samples, 0, prompt_frac=0.4, val_every=1, lengths=lengths)
        trainers = {name: Trainer(smollm2_draft(), source, torch.randn(V, 576) * 0.02, settings, Path(tmp) / name,
                                  RecordingReporter()) for name in variants}
        if args.compile_validation:
            for trainer in trainers.values():
                if trainer.core is not None:
                    trainer.core.validation = True
        for round_ in range(args.passes + 1):
            for name, plan in variants.items():
                reader.plan_batches = plan
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                metrics = trainers[name].evaluate("val")
                if cuda:
                    torch.cuda.synchronize()
                if round_:
                    results[name]["seconds"].append(round(time.perf_counter() - start, 3))
                results[name]["val_loss"] = metrics["loss"]  # evaluate returns names without the split prefix
        reader.plan_batches = plan_by_length
    for name, result in results.items():
        print(json.dumps({"variant": name, "device": args.device, "samples": args.samples,
                          "batch_tokens": args.batch_tokens, "threads": torch.get_num_threads(),
                          "compile_validation": args.compile_validation, "cuda_graphs": args.cuda_graphs, **result}))
    loss = [r["val_loss"] for r in results.values()]
    if abs(loss[0] - loss[1]) > (1e-3 if args.device == "cuda" else 1e-5) * abs(loss[0]):
        sys.exit(f"val/loss differs between the plans: {loss}")


if __name__ == "__main__":
    main()

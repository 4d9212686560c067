"""How many distinct sizes the packed unroll sees in an epoch, raw and bucketed: the number of CUDA graphs a
captured training step needs (train.compile_cuda_graphs, whose padding `attach_plan` applies here with the
trainer's own code; at the headline's lengths: 727 sets raw, 34 padded, for 1.20x the pairs computed).

Lengths are drawn like the headline's ShareGPT samples (`train_data_path.headline_lengths`); the
batches are the trainer's (`plan_batches` at the GPU preset's 16,384 tokens), the sizes those of `PackedPlan`.
What the padding costs is counted three ways, each against the compiled unroll's own padding (the length to 8):
the pairs (the head and the loss over the draft vocabulary), the kept rows (each step's layer) and the batch's
positions (step 0's embedding, fc, keys and values, and attention's rows).

    python benchmarks/unroll_sizes.py --samples 48000
    python benchmarks/unroll_sizes.py --samples 7168 --synthetic 340   # trainer_ab's pool: 8,192, 7,168 in training
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import torch
from train_data_path import headline_lengths  # benchmarks/: puts src/ on the path

from draftlab.data.reader import plan_batches
from draftlab.train.device_batch import attach_plan


def work(plan) -> dict[str, int]:
    """What a plan's sizes make the unroll compute: pairs (the head and the loss), kept rows (each step's last
    layer), positions (step 0's first layers, keys and values run at all of them)."""
    return {"pairs": len(plan.step_of), "kept": len(plan.kept), "positions": plan.shape[0] * plan.shape[1]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=48000)
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--length-bucket", type=int, default=64, help="T padded to a multiple of this")
    ap.add_argument("--row-bucket", type=int, default=8, help="B padded to a multiple of this")
    ap.add_argument("--count-bucket", type=int, default=2048, help="every count padded to one multiple of this")
    ap.add_argument("--synthetic", type=int, default=0, metavar="SEQ",
                    help="lengths from the distribution benchmarks/trainer_speed.py's pool draws from (uniform in "
                         "[SEQ/2, SEQ], the first 40%% prompt; not its very samples) instead of the headline's")
    args = ap.parse_args()
    n = args.samples
    if args.synthetic:
        g = torch.Generator().manual_seed(0)
        lengths = torch.randint(args.synthetic // 2, args.synthetic + 1, (n,), generator=g).tolist()
        prompt = [int(0.4 * length) for length in lengths]
    else:
        lengths, prompt = headline_lengths(n)
    raw, bucketed = set(), set()
    computed = {"raw": Counter(), "padded": Counter()}
    padding = {"multiple": args.length_bucket, "rows": args.row_bucket, "counts": args.count_bucket}
    batches = plan_batches(lengths, args.batch_tokens, 0, 0, True)
    for batch in batches:
        T = max(lengths[i] for i in batch)
        loss_mask = torch.zeros(len(batch), T, dtype=torch.bool)
        attention_mask = torch.zeros(len(batch), T, dtype=torch.bool)
        for row, i in enumerate(batch):
            attention_mask[row, : lengths[i]] = True
            loss_mask[row, prompt[i] : lengths[i]] = True
        masks = {"loss_mask": loss_mask, "attention_mask": attention_mask}
        plan = attach_plan(masks, args.ttt_steps, 8)["packed_plan"]  # the compiled unroll's padding today
        raw.add((*plan.shape, len(plan.kept), len(plan.needed), len(plan.step_of), *plan.sizes))
        padded = attach_plan(masks, args.ttt_steps, **padding)["packed_plan"]  # train.compile_cuda_graphs'
        bucketed.add((*padded.shape, len(padded.kept), len(padded.needed), *padded.sizes))
        computed["raw"].update(work(plan))
        computed["padded"].update(work(padded))
    print(json.dumps({"samples": n, "lengths": f"synthetic {args.synthetic}" if args.synthetic else "headline",
                      "mean_prompt": round(sum(prompt) / n, 1),
                      "mean_answer": round((sum(lengths) - sum(prompt)) / n, 1), "batches": len(batches),
                      "distinct_raw": len(raw), "distinct_bucketed": len(bucketed),
                      "length_bucket": args.length_bucket, "row_bucket": args.row_bucket,
                      "count_bucket": args.count_bucket,
                      **{f"{k}_padded_x": round(n / computed["raw"][k], 3) for k, n in computed["padded"].items()}}))


if __name__ == "__main__":
    main()

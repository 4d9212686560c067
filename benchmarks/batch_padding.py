"""How much padding the extract stage's batches carry at each `extract.batch_size`: samples sorted by length inside
each shard, cut into batches, each padded to its longest (the stage's `length_batches`). Prints one JSON line with the
padded positions over the real ones per batch size.

Real lengths come from a generate folder (`--samples-from`). Without one, from prompts (`--prompts`, a JSONL of
{"prompt": ...} as benchmarks/export_prompts.py writes) chat-templated with SmolLM2's tokenizer, kept within
`--max-prompt-tokens`, plus answers drawn from an assumed mix: `--full-share` of them at `--max-new-tokens`, the rest
uniform below (the headline's answers averaged 108 of 128 tokens; their distribution was not kept).

    python benchmarks/batch_padding.py --prompts prompts.jsonl.gz --samples 50000
    python benchmarks/batch_padding.py --samples-from outputs/generate/<key>
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path


def prompt_lengths(path: Path, max_tokens: int, count: int, root: str) -> list[int]:
    from draftlab.config.config import default_config
    from draftlab.target.target import chat_ids_many, load_target, load_tokenizer

    cfg = default_config({"paths": {"root": root}})
    models = Path(root) / "models"
    tokenizer = load_tokenizer(cfg.target, models)
    if tokenizer is None:  # the embedded SmolLM2 is converted once, then cached with its tokenizer
        tokenizer = load_target(cfg.target, models).tokenizer
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        prompts = [json.loads(line)["prompt"] for line in handle]
    lengths = [len(ids) for ids in chat_ids_many(tokenizer, prompts)]
    return [n for n in lengths if n <= max_tokens][:count]


def padding(lengths: list[int], shard_size: int, batch_size: int) -> float:
    from draftlab.stages.extract import length_batches

    padded = real = 0
    for start in range(0, len(lengths), shard_size):
        shard = lengths[start:start + shard_size]
        for indices in length_batches(shard, batch_size):
            batch = [shard[i] for i in indices]
            padded += max(batch) * len(batch)
            real += sum(batch)
    return padded / real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples-from", default=None, help="a generate folder: its samples' real lengths")
    parser.add_argument("--prompts", default=None, help="else: prompts (JSONL, .gz allowed) plus assumed answers")
    parser.add_argument("--samples", type=int, default=50000)
    parser.add_argument("--max-prompt-tokens", type=int, default=384, help="data.max_prompt_tokens (GPU preset)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--full-share", type=float, default=0.75, help="answers assumed to reach max_new_tokens")
    parser.add_argument("--shard-size", type=int, default=1024, help="extract.shard_size")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--root", default="outputs", help="paths.root (the converted SmolLM2 is cached there)")
    args = parser.parse_args()
    if args.samples_from:
        from draftlab.data.samples import read_samples

        lengths = [len(s.input_ids) for s in read_samples(Path(args.samples_from), limit=args.samples)]
        source = {"samples_from": args.samples_from}
    elif args.prompts:
        rng = random.Random(0)
        cap = args.max_new_tokens
        lengths = [n + (cap if rng.random() < args.full_share else rng.randint(1, cap))
                   for n in prompt_lengths(Path(args.prompts), args.max_prompt_tokens, args.samples, args.root)]
        source = {"prompts": args.prompts, "max_prompt_tokens": args.max_prompt_tokens, "assumed_answers": {
            "full_share": args.full_share, "max_new_tokens": cap, "rest": "uniform 1..max_new_tokens"}}
    else:
        parser.error("give --samples-from or --prompts")
    print(json.dumps({**source, "samples": len(lengths), "mean_tokens": round(sum(lengths) / len(lengths), 1),
                      "max_tokens": max(lengths), "shard_size": args.shard_size,
                      "padded_over_real": {b: round(padding(lengths, args.shard_size, b), 4)
                                           for b in args.batch_sizes}}))


if __name__ == "__main__":
    main()

"""Writes ShareGPT's prompts as JSONL, a smaller file than the 125 MB JSON, read with `data.source=jsonl`.

    python benchmarks/export_prompts.py .gpu/sharegpt_prompts.jsonl --count 24000 --max-chars 1000
    # a longer file whose pool starts with an older file's samples:
    python benchmarks/export_prompts.py .gpurun/prompts.jsonl --count 32000 --max-chars 1500 --keep-first old.jsonl

draftlab shuffles a JSONL file's prompts with `data.seed` (0 here), so a longer export would reorder the pool and
change every size's samples and validation split. `--keep-first` writes the file in the order that the seed-0
shuffle turns into: the old file's prompts in their pool order, then new ones.
"""

import argparse
import json
import random
from pathlib import Path

from draftlab.data.prompts import load_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--count", type=int, default=24000)
    ap.add_argument("--max-chars", type=int, default=1000, help="drop longer prompts (most exceed the token cap)")
    ap.add_argument("--keep-first", type=Path, help="a JSONL export whose pool order the new file keeps first")
    args = ap.parse_args()
    prompts = [p for p in load_prompts("sharegpt", None, seed=0).prompts if len(p.text) < args.max_chars]
    if args.keep_first:
        first = load_prompts("jsonl", str(args.keep_first), seed=0).prompts
        seen = {p.text for p in first}
        pool_order = (first + [p for p in prompts if p.text not in seen])[: args.count]
        shuffle = list(range(len(pool_order)))
        random.Random(0).shuffle(shuffle)  # the permutation load_prompts applies to a file of this length
        prompts = [None] * len(pool_order)
        for position, source in enumerate(shuffle):
            prompts[source] = pool_order[position]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as handle:
        for prompt in prompts[: args.count]:
            handle.write(json.dumps({"prompt": prompt.text, "id": prompt.conversation_id}) + "\n")
    if args.keep_first:
        written = load_prompts("jsonl", str(args.out), seed=0).prompts
        if [p.text for p in written[: len(first)]] != [p.text for p in first]:
            raise SystemExit(f"{args.out}: the pool order of {args.keep_first} was not kept")


if __name__ == "__main__":
    main()

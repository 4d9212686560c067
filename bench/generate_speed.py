"""Generation throughput: the plain path (HF generate per batch) against `data.generator=continuous`, same prompts.

    python bench/generate_speed.py --prompts prompts.jsonl --count 2048 --device cuda --dtype bfloat16 --paths plain static --repeats 2
    python bench/generate_speed.py --prompts prompts.jsonl --count 16 --device cpu --dtype float32 --batch-size 8

Prompts: JSONL with a "prompt" field (bench/export_prompts.py writes ShareGPT's), chat-templated by the target and
kept under --max-prompt-tokens, as the generate stage does. Tokens/s counts answer tokens (what the stage's
`generate/tokens_per_s` counts). `match` is the share of answers equal token for token between the two paths (1.0 in
fp32; in bf16 see draftlab/fastgen.py). Prints one JSON line per path.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from draftlab.config import default_config
from draftlab.fastgen import generate_continuous, generate_static
from draftlab.stages.generate import generate_batch
from draftlab.target import load_target


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--count", type=int, default=2048)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch-size", type=int, default=512, help="data.batch_size: rows per batch / slots in flight")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--compile-level", type=int, nargs="+", default=[0], help="continuous runs, one per level")
    ap.add_argument("--paths", nargs="+", default=["plain", "static", "continuous"])
    ap.add_argument("--repeats", type=int, default=1, help="runs per path (the first includes compilation)")
    ap.add_argument("--root", default="outputs")
    args = ap.parse_args()
    cfg = default_config({"target": {"device": args.device, "dtype": args.dtype}, "paths": {"root": args.root}})
    target = load_target(cfg.target, Path(args.root) / "models")
    texts = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines() if line.strip()]
    prompts = [ids for ids in (target.chat_ids(t) for t in texts) if len(ids) <= args.max_prompt_tokens]
    prompts = prompts[: args.count]
    answers = {}
    for path in args.paths:
        levels = args.compile_level if path == "continuous" else [None] * args.repeats
        for level in levels:
            name = path if level is None else f"{path}-compile{level}"
            name = name if name not in answers else f"{name}-again"
            if path == "plain":
                if target.dtype != torch.float32:
                    target.model.set_attn_implementation("eager")  # what the stage does (stack-notes 3)
                run = lambda: [a for s in range(0, len(prompts), args.batch_size)  # noqa: E731
                               for a in generate_batch(target, prompts[s:s + args.batch_size], args.max_new_tokens, 0.0)]
            elif path == "static":  # same attention as plain; batches padded to --max-prompt-tokens
                run = lambda: [a for s in range(0, len(prompts), args.batch_size)  # noqa: E731
                               for a in generate_static(target, prompts[s:s + args.batch_size], args.max_new_tokens,
                                                        0.0, args.max_prompt_tokens)]
            else:
                target.model.set_attn_implementation("sdpa")
                run = lambda: generate_continuous(target, prompts, args.max_new_tokens, args.batch_size,  # noqa: E731
                                                  compile_level=level)
            sync(target.device)
            start = time.perf_counter()
            out = run()
            sync(target.device)
            seconds = time.perf_counter() - start
            answers[name] = out
            tokens = sum(len(a) for a in out)
            first = answers[next(iter(answers))]
            match = sum(a == b for a, b in zip(out, first)) / len(out)
            print(json.dumps({"path": name, "device": args.device, "dtype": str(target.dtype), "prompts": len(prompts),
                              "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
                              "answer_tokens": tokens, "seconds": round(seconds, 2),
                              "tokens_per_s": round(tokens / seconds, 1), "match_vs_first": round(match, 4)}),
                  flush=True)


if __name__ == "__main__":
    main()

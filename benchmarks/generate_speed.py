"""Generation throughput of the `data.generator` paths on the same prompts, in one process: plain (HF generate per
batch), static (HF static cache, compiled decode), graphs (CUDA-graph decode, refilled slots; graphs-compiled:
its step through torch.compile first), continuous.

    python benchmarks/generate_speed.py --prompts prompts.jsonl --count 2048 --device cuda --dtype bfloat16 \
        --paths plain graphs static --repeats 2 --json results.jsonl
    python benchmarks/generate_speed.py --prompts prompts.jsonl --count 16 --device cpu --dtype float32 --batch-size 8

Prompts: JSONL with a "prompt" field (benchmarks/export_prompts.py writes ShareGPT's), chat-templated by the target and
kept under --max-prompt-tokens, as the generate stage does. Tokens/s counts answer tokens (what the stage's
`generate/tokens_per_s` counts). `match_vs_plain` is the share of answers equal token for token to the plain path's
(1.0 in fp32; in bf16 see BENCHMARKS.md), `prefix_vs_plain` the share of answer tokens before the first difference.
Prints one JSON line per run (and appends it to --json); a path that fails prints its error and the next one runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
import traceback
from pathlib import Path

import torch

from draftlab.config.config import default_config
from draftlab.target.target import load_target


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def runner(path: str, target, prompts: list[list[int]], args, variant):
    """A zero-argument function answering all prompts the way `data.generator=<path>` does."""
    from draftlab.generation.fastgen import generate_continuous, generate_static
    from draftlab.generation.graphgen import generate_graphs
    from draftlab.stages.generate import generate_batch

    size, new, width = args.batch_size, args.max_new_tokens, args.cache_width
    # the attention the stage gives each path: eager in bf16 (stack-notes 3) except continuous (paged sdpa)
    own = "sdpa" if path == "continuous" or target.dtype == torch.float32 else "eager"
    target.model.set_attn_implementation(own)
    if path == "plain":
        return lambda: [a for s in range(0, len(prompts), size)
                        for a in generate_batch(target, prompts[s:s + size], new, 0.0)]
    if path == "static":  # batches padded to --max-prompt-tokens
        return lambda: [a for s in range(0, len(prompts), size)
                        for a in generate_static(target, prompts[s:s + size], new, 0.0, width)]
    if path in ("graphs", "graphs-compiled"):  # compiled: torch.compile fuses the step's kernels before capture
        return lambda: generate_graphs(target, prompts, new, size, width, refill=variant,
                                       compile=path == "graphs-compiled")
    if path == "continuous":
        return lambda: generate_continuous(target, prompts, new, size, compile_level=variant)
    raise SystemExit(f"--paths: unknown path {path!r} (plain, static, graphs, graphs-compiled, continuous)")


def compare(answers: list[list[int]], reference: list[list[int]] | None) -> dict:
    if reference is None:
        return {}
    equal = sum(a == b for a, b in zip(answers, reference)) / len(answers)
    same = total = 0
    for a, b in zip(answers, reference):
        common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        same, total = same + common, total + max(len(a), len(b))
    return {"match_vs_plain": round(equal, 4), "prefix_vs_plain": round(same / max(total, 1), 4)}


def machine(target) -> dict:
    import transformers

    gpu = torch.cuda.get_device_name(target.device) if target.device.type == "cuda" else platform.processor()
    return {"machine": gpu, "torch": torch.__version__, "transformers": transformers.__version__,
            "dtype": str(target.dtype), "threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--count", type=int, default=2048)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch-size", type=int, default=512, help="data.batch_size: rows per batch / slots in flight")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=256, help="keep prompts of at most this many tokens")
    ap.add_argument("--cache-width", type=int, default=0,
                    help="the width static and graphs size their cache for (data.max_prompt_tokens in the stage); "
                         "default --max-prompt-tokens. Apart from it, a wider cache's cost is seen on the same prompts")
    ap.add_argument("--paths", nargs="+", default=["plain", "static", "graphs"])
    ap.add_argument("--refill", type=float, nargs="+", default=[0.25],
                    help="graphs runs, one per value: refill when this share of the slots is free (1.0: never "
                         "refill a running batch)")
    ap.add_argument("--compile-level", type=int, nargs="+", default=[0], help="continuous runs, one per level")
    ap.add_argument("--repeats", type=int, default=1, help="runs per path (the first includes compile/capture)")
    ap.add_argument("--root", default="outputs")
    ap.add_argument("--json", type=Path, help="append each result line to this file")
    args = ap.parse_args()
    args.cache_width = args.cache_width or args.max_prompt_tokens
    logging.basicConfig(format="%(name)s: %(message)s")  # draftlab's own lines: graph captured, or why not
    logging.getLogger("draftlab").setLevel(logging.INFO)
    cfg = default_config({"target": {"device": args.device, "dtype": args.dtype}, "paths": {"root": args.root}})
    started = time.perf_counter()
    target = load_target(cfg.target, Path(args.root) / "models")
    texts = [json.loads(line)["prompt"] for line in args.prompts.read_text().split("\n") if line.strip()]
    prompts = [ids for ids in (target.chat_ids(t) for t in texts) if len(ids) <= args.max_prompt_tokens]
    prompts = prompts[: args.count]
    common = {**machine(target), "prompts": len(prompts), "batch_size": args.batch_size,
              "max_new_tokens": args.max_new_tokens, "max_prompt_tokens": args.max_prompt_tokens,
              "cache_width": args.cache_width,
              "prompt_tokens": sum(len(p) for p in prompts)}
    emit(args.json, {"setup": common, "load_s": round(time.perf_counter() - started, 1)})
    reference = None
    for path in args.paths:
        variants = {"graphs": args.refill, "graphs-compiled": args.refill,
                    "continuous": args.compile_level}.get(path, [None])
        for variant in variants:
            for repeat in range(args.repeats):
                name = path if variant is None else f"{path}-{'compile' if path == 'continuous' else 'refill'}{variant}"
                record = {"path": name, "repeat": repeat}
                try:
                    run = runner(path, target, prompts, args, variant)
                    sync(target.device)
                    start = time.perf_counter()
                    answers = run()
                    sync(target.device)
                    seconds = time.perf_counter() - start
                except Exception as error:  # report and go on: one broken path must not cost the others' numbers
                    emit(args.json, {**record, "error": f"{type(error).__name__}: {error}"[:2000]})
                    traceback.print_exc()
                    continue
                if path == "plain" and reference is None:
                    reference = answers
                tokens = sum(len(a) for a in answers)
                record.update({"answer_tokens": tokens, "seconds": round(seconds, 2),
                               "tokens_per_s": round(tokens / seconds, 1), **compare(answers, reference)})
                if path.startswith("graphs"):
                    from draftlab.generation.graphgen import decode_mode

                    record["decode"] = decode_mode()  # graph, graph+compiled, or eager (capture failed)
                emit(args.json, record)


def emit(path: Path | None, record: dict) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if path is not None:
        with open(path, "a") as handle:
            handle.write(line + "\n")


if __name__ == "__main__":
    main()

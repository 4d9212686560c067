"""Deployed tau and speed-up of a draft with draftlab's local speculative engine, per engine mode; one JSON line
per measurement (and, with --out, all of them as one JSON list, rewritten after each).

    python benchmarks/spec_decode.py --target smollm2 --draft outputs/train/<key>/draft --device cpu --dtype float32
    python benchmarks/spec_decode.py --target smollm2 --draft DIR --device cuda --dtype bfloat16 \
        --prompts-jsonl prompts.jsonl --modes dynamic static graphs --num-steps 4 --graph-num-steps 2 3 5 6
    python benchmarks/spec_decode.py --target tiny --draft DIR --samples outputs/generate/<key> --prompts 8

Modes (serve/modes.py): `dynamic` (today's engine: the KV caches grow by concatenation), `static` (preallocated
KV caches, fixed-shape steps, eager), `graphs` (static + the fixed-shape steps as CUDA graphs; CUDA only). The
target is loaded once; each mode loads the draft afresh. Within a mode, speculative and plain greedy decoding
alternate prompt by prompt with the same cache kind (serve/measure.py `measure`), so `speedup` compares like with
like; `speedup_vs_dynamic_plain` divides by the plain decoder of the dynamic mode (today's baseline) when it ran
in the same run. `step_ms` = plain seconds per token, `cycle_ms` = speculative seconds per verify step (both
include their share of the prefill), so speed-up ~ tau x step_ms / cycle_ms: the line to read other taus from.

Prompts: the val split of a generate-stage samples folder (--samples), of a JSONL prompt file (--prompts-jsonl,
one {"text": ...} or ShareGPT record a line), else of the embedded ShareGPT (data.seed 0, val_fraction 0.05:
the pipeline's split). CPU: `--threads 1` is often faster on a shared 2-core host. A CUDA graph that cannot be
captured falls back to eager with a warning; the row's `graphs` says which steps ran as graphs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from draftlab.util import fsutil  # noqa: E402
from draftlab.config.config import default_config  # noqa: E402
from draftlab.serve import step_costs  # noqa: E402
from draftlab.serve.modes import NAMED, load_drafter  # noqa: E402
from draftlab.serve.measure import measure, summarize  # noqa: E402
from draftlab.stages.bench import held_out_prompts  # noqa: E402
from draftlab.target.target import load_target  # noqa: E402


def val_prompts(target, source: str, path: str | None, count: int, max_prompt_tokens: int, seed: int,
                val_fraction: float):
    from draftlab.data.prompts import load_prompts, split_for

    prompts = []
    for prompt in load_prompts(source, path, seed).prompts:
        if split_for(prompt.conversation_id, val_fraction) != "val":
            continue
        ids = target.chat_ids(prompt.text)
        if len(ids) <= max_prompt_tokens:
            prompts.append(ids)
        if len(prompts) == count:
            break
    return prompts


def _row(run, metrics, mode: str, num_steps: int) -> dict:
    spec_s = sum(g.seconds for g in run.spec)
    base_s = sum(g.seconds for g in run.base)
    steps = sum(g.verify_steps for g in run.spec)
    base_tokens = sum(len(g.tokens) for g in run.base)
    return {"mode": mode, "num_steps": num_steps,
            **{k.removeprefix("bench/"): round(v, 4) for k, v in metrics.items()},
            "step_ms": round(1000 * base_s / max(base_tokens, 1), 3),
            "cycle_ms": round(1000 * spec_s / max(steps, 1), 3), "graphs": run.graphs, "sync_free": run.sync_free,
            **{k: round(v, 4) for k, v in run.step_ms.items()},
            **({"speedup_bound": round(step_costs.bound(metrics["bench/tau"], num_steps, run.step_ms), 4)}
               if run.step_ms else {})}  # the dynamic mode has no fixed steps to time


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2", help="tiny | smollm2 | a Hugging Face folder or hub name")
    ap.add_argument("--draft", required=True, help="exported draft folder (config.json + model.safetensors)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    ap.add_argument("--modes", nargs="+", choices=tuple(NAMED), help="default: dynamic static (+ graphs on cuda)")
    ap.add_argument("--num-steps", type=int, nargs="+", default=[4], help="draft tokens per verification")
    ap.add_argument("--graph-num-steps", type=int, nargs="*", default=[],
                    help="more num_steps values measured in the graphs mode only (cheap there)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=Path, help="generate-stage folder; its val split gives the prompts")
    ap.add_argument("--prompts-jsonl", type=Path, help="JSONL prompt file (data.source=jsonl); its val split")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--rules", default="current", choices=("current", "legacy"), help="SGLang key rules")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default="outputs/models", help="where the converted SmolLM2 lives")
    ap.add_argument("--out", type=Path, help="write every row so far to this JSON file after each measurement")
    ap.add_argument("--dynamic-plain", type=float, default=None,
                    help="tokens/s of the dynamic plain decoder measured earlier (same prompts), when not run here")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds; measurements that would start after it are skipped (and listed as skipped)")
    args = ap.parse_args(argv)

    started = time.perf_counter()
    modes = args.modes or (["dynamic", "static", "graphs"] if args.device == "cuda" else ["dynamic", "static"])
    if "graphs" in modes and args.device != "cuda":
        ap.error("--modes graphs needs --device cuda")
    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.target if args.target in ("tiny", "smollm2") else "hf"
    target_section = {"name": name, "device": args.device, "dtype": args.dtype}
    if name == "hf":
        target_section["path"] = args.target
    cfg = default_config({"target": target_section})
    t0 = time.perf_counter()
    target = load_target(cfg.target, Path(args.cache_dir))
    load_s = time.perf_counter() - t0
    if args.samples:
        prompts = held_out_prompts(args.samples, args.prompts)
    elif args.prompts_jsonl:
        prompts = val_prompts(target, "jsonl", str(args.prompts_jsonl), args.prompts, args.max_prompt_tokens,
                              cfg.data.seed, cfg.data.val_fraction)
    else:
        prompts = val_prompts(target, "sharegpt", None, args.prompts, args.max_prompt_tokens, cfg.data.seed,
                              cfg.data.val_fraction)
    if not prompts:
        raise SystemExit("no validation prompts within --max-prompt-tokens")
    common = {"target": target.name, "draft": str(args.draft), "device": str(target.device),
              "gpu": torch.cuda.get_device_name() if target.device.type == "cuda" else None,
              "dtype": str(target.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
              "load_s": round(load_s, 2)}

    rows, dynamic_plain = [], args.dynamic_plain
    for mode_name in modes:
        mode = NAMED[mode_name]
        drafter, loaded = load_drafter(args.draft, target.model, mode, args.rules, target.dtype)
        for problem in loaded.problems():
            print(f"warning: draft as SGLang would load it: {problem}", file=sys.stderr)
        steps = list(args.num_steps) + (list(args.graph_num_steps) if mode_name == "graphs" else [])
        for num_steps in steps:
            if args.time_budget and time.perf_counter() - started > args.time_budget:
                rows.append({**common, "mode": mode_name, "num_steps": num_steps, "skipped": "time budget"})
                continue
            torch.manual_seed(args.seed)
            t0 = time.perf_counter()
            run = measure(target.model, drafter, prompts, num_steps, args.max_new_tokens, args.temperature,
                          target.eos_token_ids, args.seed, mode=mode)
            row = {**common, **_row(run, summarize(run, num_steps, args.temperature), mode_name, num_steps),
                   "draft_problems": loaded.problems(), "wall_s": round(time.perf_counter() - t0, 1)}
            if mode_name == "dynamic" and num_steps == args.num_steps[0]:
                dynamic_plain = row["baseline_tokens_per_s"]
            if dynamic_plain:
                row["speedup_vs_dynamic_plain"] = round(row["tokens_per_s"] / dynamic_plain, 4)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                fsutil.atomic_write_json(args.out, rows)
    if args.out:
        fsutil.atomic_write_json(args.out, rows)
    return rows


if __name__ == "__main__":
    main()

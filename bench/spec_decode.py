"""Deployed tau and speed-up of a draft with draftlab's local speculative engine; prints one JSON line.

    python bench/spec_decode.py --target smollm2 --draft outputs/train/<key>/draft --device cpu --dtype bfloat16
    python bench/spec_decode.py --target /models/Llama-3.1-8B-Instruct --target-kind hf --draft DIR --device cuda
    python bench/spec_decode.py --target tiny --draft DIR --samples outputs/generate/<key> --prompts 8

Prompts: the val split of a generate-stage samples folder (--samples), else held-out ShareGPT prompts (the
same deterministic split as the pipeline: data.seed 0, val_fraction 0.05). The draft is loaded as SGLang
would load it (serve/loader.py), then speculative and plain greedy decoding alternate prompt by prompt
(stages/bench.py `measure`), so both see the same machine state. tau = completion tokens / verify steps
(SGLang's count); speedup = spec tokens/s / baseline tokens/s.

CPU: bf16 is ~2x faster than fp32 for decode and a 5-token verify costs ~1.06x one token (stack-notes 3), so
bf16 is where speculation pays. `--threads 1` is often faster on a shared 2-core host. CUDA: bf16, one host
sync per cycle, drafted tokens stay on the device; shapes are dynamic (no CUDA graphs yet), so at batch size 1
kernel-launch overhead dominates a small target.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from draftlab.config import default_config  # noqa: E402
from draftlab.serve.eagle3_drafter import Eagle3Drafter  # noqa: E402
from draftlab.stages.bench import held_out_prompts, measure, summarize  # noqa: E402
from draftlab.target import load_target  # noqa: E402


def sharegpt_val_prompts(target, count: int, max_prompt_tokens: int, seed: int, val_fraction: float):
    from draftlab.data.prompts import load_prompts, split_for

    prompts = []
    for prompt in load_prompts("sharegpt", None, seed).prompts:
        if split_for(prompt.conversation_id, val_fraction) != "val":
            continue
        ids = target.chat_ids(prompt.text)
        if len(ids) <= max_prompt_tokens:
            prompts.append(ids)
        if len(prompts) == count:
            break
    return prompts


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2", help="tiny | smollm2 | a Hugging Face folder or hub name")
    ap.add_argument("--draft", required=True, help="exported draft folder (config.json + model.safetensors)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    ap.add_argument("--num-steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=Path, help="generate-stage folder; its val split gives the prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--rules", default="current", choices=("current", "legacy"), help="SGLang key rules")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default="outputs/models", help="where the converted SmolLM2 lives")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.target if args.target in ("tiny", "smollm2") else "hf"
    target_section = {"name": name, "device": args.device, "dtype": args.dtype}
    if name == "hf":
        target_section["path"] = args.target
    cfg = default_config({"target": target_section})
    t0 = time.perf_counter()
    target = load_target(cfg.target, Path(args.cache_dir))
    drafter, loaded = Eagle3Drafter.from_folder(args.draft, target.model, args.rules, target.dtype)
    load_s = time.perf_counter() - t0
    for problem in loaded.problems():
        print(f"warning: draft as SGLang would load it: {problem}", file=sys.stderr)

    if args.samples:
        prompts = held_out_prompts(args.samples, args.prompts)
    else:
        prompts = sharegpt_val_prompts(target, args.prompts, args.max_prompt_tokens, cfg.data.seed,
                                       cfg.data.val_fraction)
    torch.manual_seed(args.seed)
    run = measure(target.model, drafter, prompts, args.num_steps, args.max_new_tokens, args.temperature,
                  target.eos_token_ids, args.seed)
    metrics = summarize(run, args.num_steps, args.temperature)
    result = {
        "target": target.name, "draft": str(args.draft), "device": str(target.device),
        "dtype": str(target.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
        "num_steps": args.num_steps, "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature, "load_s": round(load_s, 2),
        "draft_problems": loaded.problems(),
        **{k.removeprefix("bench/"): round(v, 4) for k, v in metrics.items()},
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

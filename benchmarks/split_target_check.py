r"""SmolLM2's features with the target split over GPUs (target.device_map) against the target on one GPU.

The split model is loaded the way the generate and extract stages load it (`target.device_map`, through
accelerate); the features are taken the way the extract stage takes them (`HiddenTap`: the chosen layers plus
the final normed state). Both runs use the same bf16 weights and batches, so they may differ only by bf16
rounding: the check passes when every element is within `--tol` relative to the reference's largest magnitude.

    python benchmarks/split_target_check.py --prompts .gpu/sharegpt_prompts.jsonl \
        --out benchmarks/results/h200x2_split_target.json

Needs at least two GPUs; prints and writes one JSON object (device map, per-tensor errors, pass/fail).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from draftlab.config.config import default_config  # noqa: E402
from draftlab.data.features import HiddenTap, pad_batch  # noqa: E402
from draftlab.data.layers import resolve_layers  # noqa: E402
from draftlab.data.prompts import load_prompts  # noqa: E402
from draftlab.util.fsutil import atomic_write_json  # noqa: E402
from draftlab.target.target import load_target  # noqa: E402


def features(target, prompts: list[list[int]], layers: list[int], batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    tap = HiddenTap(target.model, layers)
    out = []
    for start in range(0, len(prompts), batch_size):
        seqs = [torch.tensor(p) for p in prompts[start:start + batch_size]]
        ids, mask = pad_batch(seqs)
        feats, last = tap(ids.to(target.device), mask.to(target.device), torch.bfloat16)
        for row, seq in enumerate(seqs):  # padding rows left out: only real tokens are compared
            out.append((feats[row, :len(seq)].float().cpu(), last[row, :len(seq)].float().cpu()))
    return out


def compare(ref: list[torch.Tensor], split: list[torch.Tensor]) -> dict:
    diff = max(float((a - b).abs().max()) for a, b in zip(ref, split))
    scale = max(float(a.abs().max()) for a in ref)
    mean = sum(float((a - b).abs().sum()) for a, b in zip(ref, split)) / sum(a.numel() for a in ref)
    equal = all(torch.equal(a, b) for a, b in zip(ref, split))
    return {"max_abs_diff": diff, "mean_abs_diff": mean, "ref_max_abs": scale, "rel_max_diff": diff / scale,
            "bitwise_equal": equal}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default=None, help="JSONL of prompts (default: the embedded ShareGPT)")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--device-map", default="balanced", help="accelerate device map for the split run "
                    "(balanced spreads even a small model over every GPU; auto fills GPU 0 first)")
    ap.add_argument("--tol", type=float, default=2 ** -7, help="max |split - ref| / max |ref| (bf16 epsilon)")
    ap.add_argument("--root", default="/tmp/dl-split", help="where the converted SmolLM2 is cached")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit(f"needs at least 2 GPUs, found {torch.cuda.device_count()}")

    source = "jsonl" if args.prompts else "sharegpt"
    cfg = default_config({"target": {"dtype": "bfloat16", "device": "cuda:0"}, "data": {"source": source,
                                                                                      "path": args.prompts}})
    split_cfg = default_config({"target": {"dtype": "bfloat16", "device_map": args.device_map}})
    cache = Path(args.root) / "models"

    started = time.perf_counter()
    ref_target = load_target(cfg.target, cache)
    layers = resolve_layers("auto", ref_target.num_layers)
    texts = load_prompts(source, args.prompts, 0).prompts
    prompts = [ids for ids in (ref_target.chat_ids(p.text) for p in texts[: args.samples * 2]) if len(ids) <= 512]
    prompts = prompts[: args.samples]
    ref = features(ref_target, prompts, layers, args.batch_size)
    del ref_target
    torch.cuda.empty_cache()

    split_target = load_target(split_cfg.target, cache)
    device_map = {k: str(v) for k, v in getattr(split_target.model, "hf_device_map", {}).items()}
    split = features(split_target, prompts, layers, args.batch_size)

    result = {
        "bench": "split_target_check", "target": "smollm2", "dtype": "bfloat16", "layers": layers,
        "samples": len(prompts), "tokens": sum(len(p) for p in prompts), "device_map_spec": args.device_map,
        "devices_used": dict(Counter(device_map.values())), "gpus": [torch.cuda.get_device_name(i) for i in
                                                                     range(torch.cuda.device_count())],
        "features": compare([r[0] for r in ref], [s[0] for s in split]),
        "last_hidden": compare([r[1] for r in ref], [s[1] for s in split]),
        "tol": args.tol, "seconds": round(time.perf_counter() - started, 1), "command": " ".join(sys.argv),
    }
    split_over = len(result["devices_used"]) >= 2
    result["split_over_gpus"] = split_over
    result["pass"] = split_over and all(result[k]["rel_max_diff"] <= args.tol for k in ("features", "last_hidden"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, result)
    print(json.dumps(result), flush=True)
    if not result["pass"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

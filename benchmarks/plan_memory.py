"""The plan's training-memory estimate (draftlab/plan/plan_estimates.py `train_memory`) against the peak a real training
step reaches on one GPU, for the draft of a real target's config.json (tests/data/*; random weights, random batch).

The step is the data-parallel trainer's (train/distributed.py): the padded TTT unroll under bf16 autocast, the
teacher's soft targets, backward, gradient clipping and fused AdamW, with every position counted, the case the
estimate sizes. The peak is torch.cuda.max_memory_allocated over three steps, the draft, its optimizer state, the
target head and the batch included.

    python benchmarks/plan_memory.py --configs tests/data/llama-3.1-8b --batch-tokens 4096 --rows 2

Prints one JSON line per config: estimate, measured, ratio (an H100's: benchmarks/results/h100_plan_memory.jsonl).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from draftlab.model.draft import DraftModelConfig, Eagle3Draft  # noqa: E402
from draftlab.plan.plan_estimates import draft_params, draft_shape, train_memory  # noqa: E402
from draftlab.target.target_shape import text_config  # noqa: E402
from draftlab.train.optim import build_optimizer  # noqa: E402
from draftlab.train.ttt import soft_ce_rows, target_distribution, ttt_unroll  # noqa: E402


def measure(folder: Path, batch_tokens: int, rows: int, steps: int, draft_vocab: int, layers: int) -> dict:
    config = json.loads((folder / "config.json").read_text())
    text = text_config(config)
    L = text["num_hidden_layers"]
    ids = [1, L // 2 - 1, L - 4]  # three target layers (which ones does not change the memory)
    draft_cfg = SimpleNamespace(hidden_size=None, intermediate_size=None, num_heads=None, num_kv_heads=None,
                                num_layers=layers)
    shape = draft_shape(text, draft_cfg, ids, draft_vocab, 2048)
    params = draft_params(shape)
    estimate = train_memory(shape, params, batch_tokens=batch_tokens, max_seq_len=batch_tokens // rows,
                            ttt_steps=steps, strategy="auto", gpus=1, amp=True, pool_dtype="bfloat16")
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    model = Eagle3Draft(DraftModelConfig(**shape)).to(device)
    model.t2d[:draft_vocab] = True
    opt = build_optimizer(model, 1e-4, 0.0, device)
    Ht, V, T = shape["target_hidden_size"], shape["vocab_size"], batch_tokens // rows
    lm_head = (torch.randn(V, Ht, device=device) * 0.02).to(torch.bfloat16)
    batch = {"input_ids": torch.randint(0, V, (rows, T), device=device),
             "attention_mask": torch.ones(rows, T, dtype=torch.bool, device=device),
             "loss_mask": torch.ones(rows, T, dtype=torch.bool, device=device),
             "features": torch.randn(rows, T, len(ids) * Ht, device=device).to(torch.bfloat16),
             "last_hidden": torch.randn(rows, T, Ht, device=device).to(torch.bfloat16),
             "target_top": torch.randint(0, draft_vocab, (rows, T), device=device, dtype=torch.int32)}
    trained = [p for p in model.parameters() if p.requires_grad]
    for _ in range(3):
        wide = dict(batch, features=batch["features"].float(), last_hidden=batch["last_hidden"].float())
        with torch.autocast("cuda", dtype=torch.bfloat16):
            targets = target_distribution(wide["last_hidden"], lm_head, model.d2t, model.t2d, top=wide["target_top"])
            loss, _ = ttt_unroll(model, wide, targets, steps, 0.8, ce=soft_ce_rows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 0.5)
        opt.step()
        del wide, targets, loss
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - base
    return {"config": folder.name, "batch_tokens": batch_tokens, "rows": rows, "ttt_steps": steps, "layers": layers,
            "draft_vocab": draft_vocab, "draft_params": params.total, "estimate_gb": round(estimate.total / 1e9, 2),
            "measured_gb": round(measured / 1e9, 2), "ratio": round(estimate.total / measured, 3),
            "parts_gb": {k: round(v / 1e9, 2) for k, v in estimate.parts.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", type=Path, required=True, help="folders holding a config.json")
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--draft-layers", type=int, default=1)
    args = ap.parse_args()
    for folder in args.configs:
        print(json.dumps(measure(folder, args.batch_tokens, args.rows, args.ttt_steps, args.draft_vocab,
                                 args.draft_layers)), flush=True)


if __name__ == "__main__":
    main()

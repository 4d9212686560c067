"""Training throughput (tokens/s) and MFU of the EAGLE-3 draft's TTT step on synthetic features.

    python benchmarks/train_throughput.py --device cuda                    # both presets, MFU two ways
    python benchmarks/train_throughput.py --device cpu --seq 128 --steps 2 --ttt-steps 2 --preset smollm2
    python benchmarks/train_throughput.py --preset smollm2 --batch-tokens 32768 --targets full   # the old soft targets
    python benchmarks/train_throughput.py --device cpu --preset smollm2 --seq 128 --batch-tokens 512 --ttt-steps 3 \
        --prompt-frac 0.4 --unroll packed --threads 1      # only the answer positions computed (train/packed.py)
    torchrun --standalone --nproc-per-node 2 benchmarks/train_throughput.py --preset llama8b [--strategy fsdp]

Under torchrun every GPU runs the same per-GPU batch (--batch-tokens is per GPU) through DDP (or FSDP2), the
way train.strategy does it (train/distributed.py), and rank 0 prints tokens/s over all GPUs and MFU per GPU.

One step = what train/loop.py does per batch: target distribution from last_hidden (no grad), the TTT unroll,
backward, grad clipping, fused AdamW. Prints one JSON line per preset.

How FLOPs are counted (model FLOPs, per trained token; 6 = 2 forward + 4 backward per multiply-add):
  6 * fc_params                                   (fc runs at step 0 only)
+ 6 * (layer matmul params + lm_head params) * ttt_steps
+ 12 * n_heads * head_dim * keys * ttt_steps      (QK^T and PV, forward + backward; keys = useful keys per
                                                   query: (T+1)/2 causal + j diagonal keys at step j)
Not counted (reported apart as target_head_gflop_per_token): the target head that turns last_hidden into the
soft targets, 2 * target_hidden * vocab per token, without gradient. Norms, RoPE, softmax and the optimizer are
not counted either. MFU two ways (draftlab.benchmarks.peaks): `mfu` = counted FLOP/s / the card's datasheet dense
bf16 peak (the standard definition, the goal's), `mfu_measured` = the same over the card's measured matmul rate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from draftlab.benchmarks.peaks import mfu_two_ways  # noqa: E402
from draftlab.model.draft import DraftModelConfig, Eagle3Draft  # noqa: E402
from draftlab.train.optim import build_optimizer  # noqa: E402
from draftlab.train.packed import PackedPlan, packed_unroll  # noqa: E402
from draftlab.train.ttt import compiled_soft_ce_rows, soft_ce_rows, target_distribution, ttt_unroll  # noqa: E402

PRESETS = {
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                    head_dim=64, target_hidden_size=576, vocab_size=49152, draft_vocab_size=8192),
    "llama8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                    head_dim=128, target_hidden_size=4096, vocab_size=128256, draft_vocab_size=32000),
}


def flops_per_token(cfg: DraftModelConfig, seq: int, ttt_steps: int) -> tuple[float, dict]:
    H, I, hd, nh, nkv = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_attention_heads,
                         cfg.num_key_value_heads)
    fc = cfg.num_aux * cfg.target_hidden_size * H
    layers = 0
    for i in range(cfg.num_hidden_layers):
        width = 2 * H if i == 0 else H
        layers += width * (nh + 2 * nkv) * hd + nh * hd * H + 3 * H * I
    head = H * cfg.draft_vocab_size
    keys = sum((seq + 1) / 2 + j for j in range(ttt_steps))
    attention = 12 * nh * hd * keys * cfg.num_hidden_layers
    total = 6 * fc + 6 * (layers + head) * ttt_steps + attention
    return total, {"fc_params": fc, "layer_params": layers, "lm_head_params": head,
                   "attention_gflop_per_token": attention / 1e9}


def required_flops_per_token(cfg: DraftModelConfig, seq: float, ttt_steps: int, counted: float,
                             head_trained: bool) -> float:
    """The FLOPs a training token needs (benchmarks/peers/summary.py's docstring): the fc without its input's gradient
    (4x) and step 0's keys and values at every position; the rest of the layers, the draft head (6x trained, 4x
    frozen) and attention only at the `counted` share of positions whose prediction has a loss."""
    _, parts = flops_per_token(cfg, seq, ttt_steps)
    H, kv_width = cfg.hidden_size, 2 * cfg.num_key_value_heads * cfg.head_dim
    kv = sum((2 * H if i == 0 else H) * kv_width for i in range(cfg.num_hidden_layers))  # keys of every position
    layers, head = parts["layer_params"], parts["lm_head_params"]
    step0 = 6 * kv + 6 * (layers - kv) * counted
    later = 6 * layers * (ttt_steps - 1) * counted
    heads = (6 if head_trained else 4) * head * ttt_steps * counted
    return 4 * parts["fc_params"] + step0 + later + heads + parts["attention_gflop_per_token"] * 1e9 * counted


def world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def wrap(model, args, device):
    """Under torchrun: the unroll inside DDP or FSDP2, as train.strategy does; returns (step module, world)."""
    if world() == 1:
        return None
    from draftlab.train.distributed import _Unroll

    unroll = _Unroll(model)
    if args.strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        return fully_shard(unroll)
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(unroll, device_ids=[device.index] if device.type == "cuda" else None)


def bench(name: str, args) -> dict:
    device = torch.device(args.device)
    if device.type == "cuda" and world() > 1:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    amp = device.type == "cuda"
    cfg = DraftModelConfig(**PRESETS[name], aux_layer_ids=[1, 2, 3], num_hidden_layers=args.layers,
                           max_position_embeddings=max(2048, args.seq))
    torch.manual_seed(0)
    model = Eagle3Draft(cfg)
    vd, v = cfg.draft_vocab_size, cfg.vocab_size
    model.d2t.zero_()
    model.t2d[:vd] = True
    model.to(device)
    if args.compile:  # optional: fuse the elementwise work around the matmuls; the unroll itself stays eager
        for layer in model.layers:
            layer.mlp = torch.compile(layer.mlp)
            layer.input_layernorm = torch.compile(layer.input_layernorm)
            layer.post_attention_layernorm = torch.compile(layer.post_attention_layernorm)
        model.norm = torch.compile(model.norm)
    unroll = wrap(model, args, device)
    opt = build_optimizer(model, 1e-4, 0.0, device)  # after fully_shard: the optimizer holds the shards
    params = [p for p in model.parameters() if p.requires_grad]
    feat_dtype = torch.bfloat16 if amp else torch.float32
    lm_head = (torch.randn(v, cfg.target_hidden_size, device=device) * 0.02).to(feat_dtype)
    B = max(1, args.batch_tokens // args.seq)
    g = torch.Generator(device="cpu").manual_seed(1)
    batch = {
        "input_ids": torch.randint(0, v, (B, args.seq), generator=g).to(device),
        "features": torch.randn(B, args.seq, cfg.num_aux * cfg.target_hidden_size, generator=g).to(device, feat_dtype),
        "last_hidden": torch.randn(B, args.seq, cfg.target_hidden_size, generator=g).to(device, feat_dtype),
        # the first --prompt-frac of each row is prompt: no loss there (real chats: ~40% on ShareGPT)
        "loss_mask": (torch.arange(args.seq, device=device) >= int(args.prompt_frac * args.seq)).expand(B, -1),
        "attention_mask": torch.ones(B, args.seq, dtype=torch.bool, device=device),
    }

    # draft-rows: the full-vocab argmax comes with the batch (extract stores it), the soft targets use the draft
    # rows of lm_head only; full: today's full-vocabulary matmul per batch
    top = torch.randint(0, v, (B, args.seq), generator=g).to(device, torch.int32) if args.targets == "draft-rows" else None

    ce = compiled_soft_ce_rows() if args.compile_loss else soft_ce_rows
    # --host-plan: the packed rows listed on the host each step and sent, as the trainer does (no host syncs);
    # without it the unroll lists them on the device
    host_masks = batch["loss_mask"].cpu(), batch["attention_mask"].cpu()

    def step() -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            if args.unroll == "packed":
                plan = PackedPlan.of(*host_masks, args.ttt_steps) if args.host_plan else None
                loss, _ = packed_unroll(model, {**batch, "target_top": top}, lm_head, args.ttt_steps, 0.8, ce=ce,
                                        plan=plan)
            else:
                targets = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d, top=top)
                if unroll is None:
                    loss, _ = ttt_unroll(model, batch, targets, args.ttt_steps, 0.8, ce=ce)
                else:
                    loss, _ = unroll(batch, targets, args.ttt_steps, 0.8, None, ce)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        return loss

    def sync():
        if amp:
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    if amp:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync()
    seconds = (time.perf_counter() - start) / args.steps
    if args.profile:  # where a step's time goes: the top operators by device (or CPU) time over 3 steps
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if amp else [])
        with profile(activities=acts) as prof:
            for _ in range(3):
                step()
            sync()
        key = "self_cuda_time_total" if amp else "self_cpu_time_total"
        Path(args.profile).write_text(prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=60))
    tokens = B * args.seq * world()  # every rank trains its own B x seq per step
    per_token, parts = flops_per_token(cfg, args.seq, args.ttt_steps)
    achieved = per_token * tokens / seconds / 1e12 / world()  # per GPU
    required = required_flops_per_token(cfg, args.seq, args.ttt_steps, 1.0 - args.prompt_frac,
                                        any(p.requires_grad for p in model.lm_head.parameters()))
    two = mfu_two_ways(achieved, torch.cuda.get_device_name() if amp else None)
    if args.peak:  # an untabled card: the datasheet peak given by hand
        two.update(peak_tflops=args.peak, mfu=round(achieved / args.peak, 4))
    return {
        "preset": name, "device": args.device, "gpus": world(), "strategy": args.strategy if world() > 1 else None,
        "seq": args.seq, "batch": B, "ttt_steps": args.ttt_steps,
        "layers": args.layers, "compile": args.compile, "compile_loss": args.compile_loss, "targets": args.targets, "unroll": args.unroll,
        "prompt_frac": args.prompt_frac, "host_plan": args.host_plan, "step_s": round(seconds, 4),
        "tokens_per_s": round(tokens / seconds, 1), "gflop_per_token": round(per_token / 1e9, 3),
        # what the unroll executes a token (padded: every position; packed: about the required count) against
        # what a token needs: the two MFUs count gflop_per_token
        "executed_gflop_per_token": round((per_token if args.unroll == "padded" else required) / 1e9, 3),
        "required_gflop_per_token": round(required / 1e9, 3),
        "tflops": round(achieved, 3), **two,
        "target_head_gflop_per_token": round(2 * cfg.target_hidden_size * v / 1e9, 3),
        "max_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if amp else None,
        "loss": round(float(loss.detach()), 4), **{k: (round(x, 4) if isinstance(x, float) else x) for k, x in parts.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=[*PRESETS, "both"], default="both")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch-tokens", type=int, default=4096, help="tokens per step (batch = this // seq)")
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak", type=float, default=None, help="datasheet peak TFLOP/s for MFU (default: the card's, benchmarks/peaks.py)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the MLPs and norms")
    ap.add_argument("--compile-loss", action="store_true", help="the soft cross-entropy under torch.compile")
    ap.add_argument("--targets", choices=["full", "draft-rows"], default="draft-rows",
                    help="soft targets from the full-vocab head (the old path) or its draft rows (target_top given)")
    ap.add_argument("--unroll", choices=["padded", "packed"], default="padded",
                    help="every position (ttt_unroll) or only the positions that count (train/packed.py; the CPU loop's)")
    ap.add_argument("--host-plan", action="store_true", help="packed: list the rows on the host (the trainer's way)")
    ap.add_argument("--prompt-frac", type=float, default=0.0, help="share of each row that is prompt (no loss)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads")
    ap.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp", help="under torchrun")
    ap.add_argument("--profile", default=None, help="write torch.profiler's top operators over 3 more steps here")
    args = ap.parse_args()
    if args.unroll == "packed" and world() > 1:
        ap.error("--unroll packed: single process only (train/distributed.py runs the padded unroll)")
    if world() > 1:
        import torch.distributed as dist

        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    for name in PRESETS if args.preset == "both" else [args.preset]:
        result = bench(name, args)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

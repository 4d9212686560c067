"""Training throughput with real offline batches: batches read in line (as before) against read ahead on a worker
thread (FeatureSource.batches), on synthetic SmolLM2-shaped shards (bf16 features, target_top).

    python benchmarks/train_data_path.py --device cuda --batch-tokens 32768 --samples 3000
    python benchmarks/train_data_path.py --device cpu --batch-tokens 1024 --samples 40 --seq 64 --ttt-steps 2

One step = train_throughput.py's step (soft targets from the draft rows, TTT unroll, backward, clip, AdamW) on the
batch as FeatureSource gives it, moved with .to(device, non_blocking=True) as train/loop.py does. Prints one JSON
line per mode.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from draftlab.data.features import FORMAT, Entry  # noqa: E402
from draftlab.data.reader import FeatureSource  # noqa: E402
from draftlab.util.fsutil import atomic_write_json, read_json  # noqa: E402
from draftlab.model.draft import DraftModelConfig, Eagle3Draft  # noqa: E402
from draftlab.train.optim import build_optimizer  # noqa: E402
from draftlab.train.ttt import target_distribution, ttt_unroll  # noqa: E402

H, V, VD = 576, 49152, 8192


def headline_lengths(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """(sample lengths, prompt lengths) drawn like the headline's ShareGPT samples: prompts log-normal around 50
    chat tokens, at most 384; answers of 128 tokens, the cap, for 60% of samples, else 8-127 (means about 67 and
    104, as measured there)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.clamp(torch.exp(torch.randn(n, generator=g) * 0.8 + math.log(50)), 12, 384).long()
    answer = torch.where(torch.rand(n, generator=g) < 0.6, torch.full((n,), 128),
                         torch.randint(8, 128, (n,), generator=g))
    return (prompt + answer).tolist(), prompt.tolist()


def synthetic_source(folder: Path, samples: int, seq: int, per_shard: int = 1024,
                     prompt_frac: float = 0.0, val_every: int = 0, lengths: list[int] | None = None) -> FeatureSource:
    """`prompt_frac` of each sample (its start) is prompt: outside the loss, as a ShareGPT turn's prompt is;
    every `val_every`-th sample goes to the validation split (0: none); `lengths`: the samples' lengths (default:
    uniform in [seq/2, seq]). A folder that already holds the pool made with these arguments (its
    `synthetic.json`) is read as it is: the 64-shard pool took about 40 s to make."""
    args = {"samples": samples, "seq": seq, "per_shard": per_shard, "prompt_frac": prompt_frac, "val_every": val_every,
            "lengths": lengths}
    made = read_json(folder / "synthetic.json")
    if made is not None and made["args"] == args:
        return FeatureSource(made["manifest"], [Entry(*e) for e in made["entries"]], folder, samples, VD)
    # the shards are rewritten in place: a run killed among them must not leave the old record to vouch for them
    (folder / "synthetic.json").unlink(missing_ok=True)
    g = torch.Generator().manual_seed(0)
    shards, entries = [], []
    for number, first in enumerate(range(0, samples, per_shard)):
        n = min(per_shard, samples - first)
        if lengths is None:
            shard_lengths = torch.randint(seq // 2, seq + 1, (n,), generator=g).tolist()
        else:
            shard_lengths = lengths[first:first + n]
        T = sum(shard_lengths)
        name = f"shard-{number:05d}"
        loss_mask = torch.cat([(torch.arange(length) >= int(prompt_frac * length)).to(torch.uint8)
                               for length in shard_lengths])
        save_file({"input_ids": torch.randint(0, V, (T,), generator=g, dtype=torch.int32),
                   "loss_mask": loss_mask,
                   "features": torch.randn(T, 3 * H, generator=g).to(torch.bfloat16),
                   "last_hidden": torch.randn(T, H, generator=g).to(torch.bfloat16),
                   "target_top": torch.randint(0, V, (T,), generator=g, dtype=torch.int32)},
                  str(folder / f"{name}.safetensors"))
        shards.append({"name": name})
        start = 0
        for i, length in enumerate(shard_lengths):
            split = "val" if val_every and (first + i) % val_every == val_every - 1 else "train"
            entries.append(Entry(first + i, split, length, number, start))
            start += length
    manifest = {"format": FORMAT, "dtype": "bfloat16", "shapes": {"features": [-1, 3 * H], "last_hidden": [-1, H]},
                "target_top": True, "shards": shards, "layer_ids": [1, 14, 26]}
    entries_json = [[e.sample_index, e.split, e.length, e.shard, e.start] for e in entries]
    atomic_write_json(folder / "synthetic.json", {"args": args, "manifest": manifest, "entries": entries_json})
    return FeatureSource(manifest, entries, folder, samples, VD)


def smollm2_draft() -> Eagle3Draft:
    """The SmolLM2-shaped one-layer draft on the synthetic shards' layers, its vocabulary the first VD ids."""
    cfg = DraftModelConfig(hidden_size=H, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                           head_dim=64, target_hidden_size=H, vocab_size=V, draft_vocab_size=VD,
                           aux_layer_ids=[1, 14, 26], num_hidden_layers=1, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = Eagle3Draft(cfg)
    model.d2t.zero_()
    model.t2d[:VD] = True
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--seq", type=int, default=340, help="longest sample; lengths are uniform in [seq/2, seq]")
    ap.add_argument("--batch-tokens", type=int, default=32768)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--max-batches", type=int, default=40)
    args = ap.parse_args()
    device = torch.device(args.device)
    amp = device.type == "cuda"
    model = smollm2_draft().to(device)
    opt = build_optimizer(model, 1e-4, 0.0, device)
    params = [p for p in model.parameters() if p.requires_grad]
    lm_head = (torch.randn(V, H, device=device) * 0.02).to(torch.bfloat16 if amp else torch.float32)

    def step(batch: dict) -> None:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        if not amp:
            batch["features"], batch["last_hidden"] = batch["features"].float(), batch["last_hidden"].float()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            targets = target_distribution(batch["last_hidden"], lm_head, model.d2t, model.t2d, top=batch["target_top"])
            loss, _ = ttt_unroll(model, batch, targets, args.ttt_steps, 0.8)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()

    with tempfile.TemporaryDirectory(prefix="train-data-path-") as tmp:
        source = synthetic_source(Path(tmp), args.samples, args.seq)
        plan = source._plan("train", 0, args.batch_tokens, 2048, 0, True)[: args.max_batches]
        modes = {
            "in_line": lambda: (source._offline_batch(g, 2048) for g in plan),  # what training did before
            "prefetched": lambda: (b for _, b in zip(plan, source.batches("train", 0, args.batch_tokens, 2048, 0))),
        }
        for name in ["in_line", "prefetched", "in_line", "prefetched"]:  # alternated; the second of each counts
            for i, batch in enumerate(modes[name]()):
                if i == 2:  # the first batches warm up kernels and the allocators
                    if amp:
                        torch.cuda.synchronize()
                    start, tokens = time.perf_counter(), 0
                if i >= 2:
                    tokens += batch["input_ids"].numel()
                step(batch)
            if amp:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            print(json.dumps({"mode": name, "device": args.device, "batch_tokens": args.batch_tokens,
                              "batches_timed": len(plan) - 2, "padded_tokens_per_s": round(tokens / seconds, 1),
                              "s_per_batch": round(seconds / (len(plan) - 2), 4)}), flush=True)


if __name__ == "__main__":
    main()

"""A synthetic features folder for a target of any width, in draftlab's extract format (what convert.py turns into
the peers' formats): the 8B-shaped comparison's data, written once, outside every timed run.

    python benchmarks/peers/synthetic.py OUT --preset llama8b --samples 352 --device cuda
    python benchmarks/peers/synthetic.py OUT --hidden 32 --vocab 512 --draft-vocab 128 --layers 8 --heads 4 \
        --kv-heads 2 --intermediate 64 --samples 12 --min-len 16 --max-len 48        # a tiny one, for tests

The task is learnable, so that val/loss at equal tokens can tell trainers apart: token ids come from a random
set of draft-vocabulary size; the target's normed last state at t points at the next token's head row,
y_t = rmsnorm(W[x_{t+1}] + noise), with the head W scaled so that the teacher puts most of its mass there (a
logit gap of about ln(vocab) + 2); the three aux features are y_t plus independent noise. The final norm's weight
is ones (convert.py writes ones without --target), so the pre-norm state speculators wants is y itself. Prompt
positions (the first --prompt-frac of each sample) are outside the loss, as a ShareGPT turn's prompt is.
Writes OUT/{manifest.json, shard-NNNNN.safetensors, target_head.safetensors, vocab/nN-vV.safetensors}.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: train_throughput's draft shapes
from draftlab.data.features import FORMAT, HEAD_FILE  # noqa: E402
from draftlab.data.vocab import vocab_name, vocab_path, write_vocab  # noqa: E402
from draftlab.sglang.capture import llama  # noqa: E402
from train_throughput import PRESETS as DRAFT_SHAPES  # noqa: E402


def _target_shape(draft: dict, layers: int, rope_theta: float, eps: float) -> dict:
    """The target whose features a draft of train_throughput's shape reads, in this script's argument names."""
    return dict(hidden=draft["target_hidden_size"], vocab=draft["vocab_size"], draft_vocab=draft["draft_vocab_size"],
                layers=layers, heads=draft["num_attention_heads"], kv_heads=draft["num_key_value_heads"],
                intermediate=draft["intermediate_size"], rope_theta=rope_theta, eps=eps)


# Llama-3.1-8B: 32 layers; the draft's widths are train_throughput's, so the peers and the MFU bench agree
PRESETS = {"llama8b": _target_shape(DRAFT_SHAPES["llama8b"], layers=32, rope_theta=500000.0, eps=1e-5)}


def target_config(a) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": a.hidden,
            "intermediate_size": a.intermediate, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
            "head_dim": a.hidden // a.heads, "num_hidden_layers": a.layers, "vocab_size": a.vocab,
            "rms_norm_eps": a.eps, "rope_theta": a.rope_theta, "max_position_embeddings": 131072,
            "hidden_act": "silu", "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1,
            "eos_token_id": 2}


def rmsnorm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def make_head(a, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed_tokens, lm_head) fp32: rows of norm ~1, the head scaled to the logit gap the docstring names."""
    embed = torch.randn(a.vocab, a.hidden, generator=g) / math.sqrt(a.hidden)
    head = torch.randn(a.vocab, a.hidden, generator=g) / math.sqrt(a.hidden)
    # y has norm ~sqrt(H) and leans on W[x] by cos ~ 1/sqrt(2): the gap is scale * sqrt(H / 2)
    scale = (math.log(a.vocab) + 2) / math.sqrt(a.hidden / 2)
    return embed, head * scale


def make_sample(length: int, prompt: int, token_set: torch.Tensor, head: torch.Tensor, row_norm: float, a,
                g: torch.Generator, noise: torch.Generator) -> dict[str, torch.Tensor]:
    """One sample; `g` (CPU) draws ids, `noise` (on head's device, where the wide tensors are made) the states."""
    ids = token_set[torch.randint(0, len(token_set), (length + 1,), generator=g)]
    nxt = ids[1:].to(head.device)  # the token each position's target state predicts
    direction = head.index_select(0, nxt) / row_norm

    def randn() -> torch.Tensor:
        return torch.randn(length, a.hidden, generator=noise, device=head.device) / math.sqrt(a.hidden)

    y = rmsnorm(direction + randn(), a.eps)
    aux = [rmsnorm(y + randn() * 0.5 * math.sqrt(a.hidden), a.eps) for _ in range(3)]
    top = (y @ head.T).argmax(-1)  # the teacher's full-vocabulary argmax, as extract stores it
    return {"input_ids": ids[:-1].to(torch.int32), "loss_mask": (torch.arange(length) >= prompt).to(torch.uint8),
            "features": torch.cat(aux, -1).to(torch.bfloat16).cpu(), "last_hidden": y.to(torch.bfloat16).cpu(),
            "target_top": top.to(torch.int32).cpu()}


def write_pool(out: Path, a) -> dict:
    """Writes the folder; returns its manifest."""
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(a.device)
    g = torch.Generator().manual_seed(a.seed)
    embed, head = make_head(a, g)
    save_file({"embed_tokens.weight": embed, "lm_head.weight": head}, str(out / HEAD_FILE))
    head_dev = head.to(device)
    row_norm = float(head.norm(dim=-1).mean())
    noise = torch.Generator(device=device).manual_seed(a.seed + 1)
    token_set = torch.randperm(a.vocab, generator=g)[: a.draft_vocab]
    counts = torch.zeros(a.vocab, dtype=torch.int64)
    counts[token_set] = 1  # the draft vocabulary is the set, however few samples cover it
    shards, total = [], 0
    for first in range(0, a.samples, a.per_shard):
        rows = range(first, min(first + a.per_shard, a.samples))
        lengths = torch.randint(a.min_len, a.max_len + 1, (len(rows),), generator=g).tolist()
        parts = [make_sample(L, int(a.prompt_frac * L), token_set, head_dev, row_norm, a, g, noise) for L in lengths]
        split = torch.tensor([int(a.val_every > 0 and i % a.val_every == a.val_every - 1) for i in rows],
                             dtype=torch.uint8)  # 1 = val, as data.samples.SPLITS orders them
        for part, is_val in zip(parts, split.tolist()):
            if not is_val:  # the draft vocabulary counts the training split's loss tokens, as extract does
                counts += torch.bincount(part["input_ids"][part["loss_mask"].bool()].long(), minlength=a.vocab)
        tensors = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        tensors["offsets"] = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
        tensors["sample_index"] = torch.tensor(list(rows), dtype=torch.int64)
        tensors["split"] = split
        name = f"shard-{len(shards):05d}"
        save_file(tensors, str(out / f"{name}.safetensors"))
        shards.append({"name": name, "first": first, "samples": len(rows), "tokens": sum(lengths)})
        total += sum(lengths)
    coverage = write_vocab(vocab_path(out, a.samples, a.draft_vocab), counts, a.draft_vocab)
    capture = llama()  # the synthetic target is a Llama: SGLang's default ids and their capture points
    ids = capture.default_ids(a.layers)
    manifest = {"format": FORMAT, "mode": "offline", "dtype": "bfloat16", "layer_ids": ids,
                "capture_points": capture.points(ids, a.layers), "shapes": {"features": [-1, 3 * a.hidden],
                                                                  "last_hidden": [-1, a.hidden]},
                "target_top": True, "shards": shards, "num_samples": a.samples, "tokens": total,
                "vocabs": {vocab_name(a.samples, a.draft_vocab): coverage},
                "target": {"name": f"synthetic-{a.preset or 'custom'}", "config": target_config(a),
                           "hidden_size": a.hidden, "vocab_size": a.vocab, "num_layers": a.layers},
                "synthetic": {k: v for k, v in vars(a).items() if k != "out"}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def parse(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None)
    for name, default in (("hidden", 64), ("vocab", 512), ("draft_vocab", 128), ("layers", 8), ("heads", 4),
                          ("kv_heads", 2), ("intermediate", 128)):
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--samples", type=int, default=352)
    ap.add_argument("--val-every", type=int, default=11, help="every k-th sample is validation (0: none)")
    ap.add_argument("--min-len", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=1536)
    ap.add_argument("--prompt-frac", type=float, default=0.4)
    ap.add_argument("--per-shard", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    for key, value in PRESETS.get(a.preset, {}).items():
        setattr(a, key, value)
    return a


def main() -> None:
    a = parse()
    manifest = write_pool(a.out, a)
    print(json.dumps({"out": str(a.out), "samples": a.samples, "tokens": manifest["tokens"],
                      "vocab_coverage": manifest["vocabs"][vocab_name(a.samples, a.draft_vocab)]}))


if __name__ == "__main__":
    main()

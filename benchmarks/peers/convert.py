"""Turns draftlab's extract folder into the inputs of speculators and SpecForge: the same samples, the same
train/val split and the same draft vocabulary (d2t/t2d) for all three trainers.

    $PEERS/venv-spec/bin/python benchmarks/peers/convert.py EXTRACT_DIR N OUT [--target TARGET_DIR] [--peers ...]

EXTRACT_DIR is a features folder (outputs/extract/<key>, or synthetic.py's), N the samples to take (its
vocab/nN-v*.safetensors must exist). Writes, all outside any timed run:
- OUT/target: the target as far as the peers read it (config.json from the manifest, embed_tokens, an explicit
  lm_head, the final norm and a safetensors index: SpecForge's TargetHead needs the index and the untied head);
  the norm weight and the tokenizer come from TARGET_DIR (SmolLM2's converted folder) when given, else the norm
  is ones (synthetic.py's features are normed with ones);
- OUT/spec: speculators' offline format (Arrow rows, hidden_states/hs_i.safetensors, token_freq.pt, d2t/t2d);
- OUT/sf/{train,eval}, vocab_mapping.pt and draft_config.json: SpecForge's;
- OUT/split.json: counts, the draft's shape and the token moments summary.py needs for MFU.
Samples are streamed shard by shard, so a pool larger than memory converts. `--peers` names the formats to write
(both by default; none: only the target and split.json, enough for draftlab alone). speculators' format needs
`datasets` (the speculators venv has it); of draftlab it imports the shard reader and the plan's draft shape only.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from draftlab.data.samples import unpack  # noqa: E402  (torch, safetensors and the stdlib only)
from draftlab.plan.plan_estimates import draft_shape as plan_draft_shape  # noqa: E402  (the stdlib only)

TARGET_FILES = (".json", ".jinja", ".txt", ".model")  # tokenizer and config files copied from TARGET_DIR


def splits(extract: Path, manifest: dict, n: int) -> dict[int, bool]:
    """{sample index: is validation} for the first n samples, from the shards' small tensors only."""
    is_val = {}
    for shard in manifest["shards"]:
        if shard["first"] >= n:
            break
        with safe_open(str(extract / f"{shard['name']}.safetensors"), framework="pt") as f:
            t = {k: f.get_tensor(k) for k in ("offsets", "sample_index", "split")}
        for index, split, _ in unpack(t):
            if index < n:
                is_val[index] = split == "val"
    if len(is_val) != n:
        sys.exit(f"{extract}: {len(is_val)} samples extracted, {n} asked for")
    return is_val


def samples(extract: Path, manifest: dict, n: int):
    """Yields each of the first n samples with its features, one shard in memory at a time."""
    for shard in manifest["shards"]:
        if shard["first"] >= n:
            break
        t = load_file(str(extract / f"{shard['name']}.safetensors"))
        for index, _, span in unpack(t):  # draftlab's own reader of a packed shard
            if index < n:
                yield {"index": index, "ids": t["input_ids"][span].long(), "loss": t["loss_mask"][span].long(),
                       "feats": t["features"][span], "last": t["last_hidden"][span]}


def target_config(manifest: dict) -> dict:
    config = dict(manifest["target"]["config"])
    config["architectures"] = config.get("architectures") or ["LlamaForCausalLM"]
    config["tie_word_embeddings"] = False  # the head is written out
    return config


def write_target(extract: Path, manifest: dict, source: Path | None, out: Path) -> tuple[torch.Tensor, dict]:
    """The peers' target folder; returns (final norm weight, config)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    config = target_config(manifest)
    head = load_file(str(extract / "target_head.safetensors"))
    norm = torch.ones(config["hidden_size"])
    if source is not None:
        for f in source.iterdir():
            if f.suffix in TARGET_FILES and f.name not in ("config.json", "model.safetensors.index.json"):
                shutil.copy2(f, out / f.name)
        with safe_open(str(source / "model.safetensors"), framework="pt") as f:
            norm = f.get_tensor("model.norm.weight").float()
    weights = {"model.embed_tokens.weight": head["embed_tokens.weight"], "lm_head.weight": head["lm_head.weight"],
               "model.norm.weight": norm}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: "model.safetensors" for k in weights}}))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return norm, config


def draft_shape(config: dict, layer_ids: list[int], draft_vocab: int) -> dict:
    """The one-layer draft all three trainers build: draftlab's own with draft.* unset (the target's shape)."""
    target_shape = SimpleNamespace(hidden_size=None, num_heads=None, num_kv_heads=None, intermediate_size=None,
                                   num_layers=1)
    return plan_draft_shape(config, target_shape, layer_ids, draft_vocab, 0)


def specforge_draft_config(config: dict, shape: dict, dtype: str) -> dict:
    draft = {k: config[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id") if config.get(k) is not None}
    draft.update({k: v for k, v in shape.items() if k != "aux_layer_ids"})
    draft.update({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "tie_word_embeddings": False,
                  "rope_scaling": None, "use_cache": True, "torch_dtype": dtype})
    return draft


class Writers:
    """Both peers' per-sample files; speculators numbers its rows train first, then val (it trains on the first
    rows), SpecForge keeps draftlab's sample index in the file name."""

    def __init__(self, out: Path, norm_w: torch.Tensor, eps: float, row_of: dict[int, int],
                 peers: tuple[str, ...] = ("speculators", "specforge")):
        self.spec, self.sf, self.norm_w, self.eps, self.row_of = out / "spec", out / "sf", norm_w, eps, row_of
        self.peers = peers
        for folder in (self.spec, self.sf):
            shutil.rmtree(folder, ignore_errors=True)
        if "speculators" in peers:
            (self.spec / "hidden_states").mkdir(parents=True)
        for split in ("train", "eval"):
            (self.sf / split).mkdir(parents=True)  # the draft config lives here whatever is written
        self.rows: dict[int, dict] = {}
        self.worst = 0.0

    def add(self, s: dict, is_val: bool) -> None:
        """speculators applies the target's final norm itself, so it gets the pre-norm state: draftlab keeps the
        normed y = x / rms(x) * w; y / w has rms ~1, so the norm maps it back to y (the worst error is printed)."""
        T, H = s["last"].shape
        y = s["last"].float()
        pre = (y / self.norm_w).to(torch.bfloat16)
        back = pre.float() * torch.rsqrt(pre.float().pow(2).mean(-1, keepdim=True) + self.eps) * self.norm_w
        error = (back - y).norm(dim=-1) / y.norm(dim=-1).clamp(min=1e-6)
        self.worst = max(self.worst, float(error.max()))
        row = self.row_of[s["index"]]
        if "speculators" in self.peers:
            states = torch.cat([s["feats"].view(T, -1, H), pre[:, None].to(s["feats"].dtype)], 1).contiguous()
            save_file({"hidden_states": states, "token_ids": s["ids"].clone()},
                      str(self.spec / "hidden_states" / f"hs_{row}.safetensors"))
            self.rows[row] = {"input_ids": s["ids"].tolist(), "loss_mask": s["loss"].tolist(), "seq_len": T}
        if "specforge" in self.peers:
            torch.save({"input_ids": s["ids"].clone(), "loss_mask": s["loss"].clone(),
                        "aux_hidden_state": s["feats"].clone()[None], "hidden_state": s["last"].clone()[None]},
                       self.sf / ("eval" if is_val else "train") / f"data_{s['index']:06d}.ckpt")

    def finish(self, d2t: torch.Tensor, t2d: torch.Tensor, counts: torch.Tensor) -> None:
        torch.save({"d2t": d2t, "t2d": t2d}, self.sf / "vocab_mapping.pt")
        print(f"worst relative error of norm(pre-norm) against draftlab's state {self.worst:.1e}")
        if "speculators" not in self.peers:
            return
        from datasets import Dataset  # the speculators venv's

        rows = [self.rows[i] for i in range(len(self.rows))]
        ds = Dataset.from_dict({k: [r[k] for r in rows] for k in ("input_ids", "loss_mask", "seq_len")})
        ds.set_format("torch")
        ds.save_to_disk(str(self.spec))
        torch.save({int(k): int(counts[k]) for k in counts.nonzero().flatten().tolist()}, self.spec / "token_freq.pt")
        np.save(self.spec / f"d2t-{len(d2t)}.npy", d2t.numpy())
        np.save(self.spec / f"t2d-{len(d2t)}.npy", t2d.numpy())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("extract", type=Path)
    ap.add_argument("n", type=int)
    ap.add_argument("out", type=Path)
    ap.add_argument("--target", type=Path, default=None, help="the target's HF folder: final norm and tokenizer")
    ap.add_argument("--dtype", default="bfloat16", help="SpecForge's draft config torch_dtype")
    ap.add_argument("--peers", nargs="*", choices=("speculators", "specforge"), default=["speculators", "specforge"])
    args = ap.parse_args()
    extract, n, out = args.extract, args.n, args.out
    manifest = json.loads((extract / "manifest.json").read_text())
    vocab = sorted((extract / "vocab").glob(f"n{n}-v*.safetensors"))
    if len(vocab) != 1:
        sys.exit(f"{extract}/vocab: want one n{n}-v*.safetensors, found {[v.name for v in vocab]}")
    v = load_file(str(vocab[0]))
    d2t, t2d, counts = v["d2t"].long(), v["t2d"].bool(), v["counts"]
    is_val = splits(extract, manifest, n)
    train = sorted(i for i, val in is_val.items() if not val)
    val = sorted(i for i, val in is_val.items() if val)
    row_of = {index: row for row, index in enumerate(train + val)}
    norm_w, config = write_target(extract, manifest, args.target, out / "target")
    writers = Writers(out, norm_w.float(), float(config.get("rms_norm_eps", 1e-5)), row_of, tuple(args.peers))
    moments = {"train_tokens": 0, "train_sq_tokens": 0, "val_tokens": 0, "train_loss_tokens": 0}
    for s in samples(extract, manifest, n):
        writers.add(s, is_val[s["index"]])
        T = len(s["ids"])
        if is_val[s["index"]]:
            moments["val_tokens"] += T
        else:
            moments["train_tokens"] += T
            moments["train_sq_tokens"] += T * T  # sum of L^2: the attention FLOPs of causal documents
            moments["train_loss_tokens"] += int(s["loss"].sum())
    writers.finish(d2t, t2d, counts)
    shape = draft_shape(config, manifest["layer_ids"], len(d2t))
    (out / "sf" / "draft_config.json").write_text(json.dumps(specforge_draft_config(config, shape, args.dtype),
                                                             indent=1))
    ratio = (len(train) + 0.5) / n  # int(n * ratio) == len(train): speculators' split is draftlab's
    split = {"n": n, "n_train": len(train), "n_val": len(val), "train_ratio": ratio, "extract": str(extract.resolve()),
             "layer_ids": manifest["layer_ids"], "hf_layer_ids": [k + 1 for k in manifest["layer_ids"]],
             "draft_vocab": len(d2t), "draft": shape, "pad_token_id": config.get("pad_token_id") or 0, **moments}
    (out / "split.json").write_text(json.dumps(split, indent=1))
    print(json.dumps(split))


if __name__ == "__main__":
    main()

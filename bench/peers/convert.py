"""Turns draftlab's extract folder into the inputs of speculators and SpecForge: the same samples, the same
train/val split and the same draft vocabulary (d2t/t2d) for all three trainers.

    $PEERS/venv-spec/bin/python bench/peers/convert.py EXTRACT_DIR N TARGET_DIR $PEERS/data

EXTRACT_DIR is outputs/extract/<key> (layers [1, 14, 26] = HF hidden_states [2, 15, 27]), TARGET_DIR the converted
SmolLM2 folder (outputs/models/smollm2-<key>). Writes OUT/target (the target with an explicit lm_head and a
safetensors index: SpecForge's TargetHead needs both; SmolLM2 ties its head), OUT/spec (speculators' offline
format), OUT/sf/{train,eval} + vocab_mapping.pt + draft_config.json (SpecForge's), and OUT/split.json (counts).
Runs in the speculators venv (it needs `datasets`); of draftlab it imports the shard reader only.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from draftlab.data.samples import unpack  # noqa: E402  (torch, safetensors and the stdlib only)


def read_samples(extract: Path, n: int) -> tuple[dict, list[dict]]:
    manifest = json.loads((extract / "manifest.json").read_text())
    samples = []
    for shard in manifest["shards"]:
        if shard["first"] >= n:
            break
        t = load_file(str(extract / f"{shard['name']}.safetensors"))
        for index, split, span in unpack(t):  # draftlab's own reader of a packed shard
            if index < n:
                samples.append({"index": index, "val": split == "val", "ids": t["input_ids"][span].long(),
                                "loss": t["loss_mask"][span].long(), "feats": t["features"][span],
                                "last": t["last_hidden"][span]})
    samples.sort(key=lambda s: s["index"])
    if len(samples) != n:
        sys.exit(f"{extract}: {len(samples)} samples extracted, {n} asked for")
    return manifest, samples


def write_target(src: Path, out: Path) -> dict[str, torch.Tensor]:
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix in (".json", ".jinja") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, out / f.name)
    weights = load_file(str(src / "model.safetensors"))
    weights.setdefault("lm_head.weight", weights["model.embed_tokens.weight"].clone())
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in weights}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return weights


def write_speculators(rows: list[dict], out: Path, norm_w: torch.Tensor, d2t, t2d, counts) -> None:
    """Arrow rows + hidden_states/hs_i.safetensors ([T, 3 aux + last, H] bf16) + token_freq.pt + d2t/t2d.
    speculators applies the target's final norm itself, so it wants the pre-norm last state; draftlab keeps the
    normed y = x / rms(x) * w. y / w has rms ~1, so the norm maps it back to y (checked below)."""
    shutil.rmtree(out, ignore_errors=True)
    (out / "hidden_states").mkdir(parents=True)
    worst = 0.0
    for i, s in enumerate(rows):
        T, H = s["last"].shape
        pre = (s["last"].float() / norm_w).to(torch.bfloat16)
        back = pre.float() * torch.rsqrt(pre.float().pow(2).mean(-1, keepdim=True) + 1e-5) * norm_w
        worst = max(worst, float(((back - s["last"].float()).norm(dim=-1) / s["last"].float().norm(dim=-1).clamp(min=1e-6)).max()))
        states = torch.cat([s["feats"].view(T, -1, H), pre[:, None]], 1).contiguous()
        save_file({"hidden_states": states, "token_ids": s["ids"].clone()}, str(out / "hidden_states" / f"hs_{i}.safetensors"))
    ds = Dataset.from_dict({"input_ids": [s["ids"].tolist() for s in rows], "loss_mask": [s["loss"].tolist() for s in rows],
                            "seq_len": [len(s["ids"]) for s in rows]})
    ds.set_format("torch")
    ds.save_to_disk(str(out))
    torch.save({int(k): int(counts[k]) for k in counts.nonzero().flatten().tolist()}, out / "token_freq.pt")
    np.save(out / f"d2t-{len(d2t)}.npy", d2t.numpy())
    np.save(out / f"t2d-{len(d2t)}.npy", t2d.numpy())
    print(f"speculators: {out}; worst relative error of norm(pre-norm) against draftlab's state {worst:.1e}")


def write_specforge(train: list[dict], val: list[dict], out: Path, d2t, t2d, target_config: dict, vd: int) -> None:
    """One torch.save dict per sample (input_ids, loss_mask, aux_hidden_state [1,T,3H], hidden_state [1,T,H]
    post-norm), the vocab mapping, and the draft config (1 layer, shaped as the target)."""
    shutil.rmtree(out, ignore_errors=True)
    for split, group in (("train", train), ("eval", val)):
        (out / split).mkdir(parents=True)
        for s in group:
            torch.save({"input_ids": s["ids"].clone(), "loss_mask": s["loss"].clone(),
                        "aux_hidden_state": s["feats"].clone()[None], "hidden_state": s["last"].clone()[None]},
                       out / split / f"data_{s['index']:05d}.ckpt")
    torch.save({"d2t": d2t, "t2d": t2d}, out / "vocab_mapping.pt")
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "hidden_act", "max_position_embeddings", "rms_norm_eps", "vocab_size", "pad_token_id", "bos_token_id",
            "eos_token_id")
    draft = {k: target_config[k] for k in keys if k in target_config}
    draft["rope_theta"] = target_config.get("rope_theta") or target_config["rope_parameters"]["rope_theta"]
    draft.update({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                  "draft_vocab_size": vd, "tie_word_embeddings": False, "rope_scaling": None, "use_cache": True,
                  "torch_dtype": "float32"})
    (out / "draft_config.json").write_text(json.dumps(draft, indent=1))
    print(f"SpecForge: {out}")


def main() -> None:
    extract, n, target, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    manifest, samples = read_samples(extract, n)
    vocab = sorted((extract / "vocab").glob(f"n{n}-v*.safetensors"))
    if len(vocab) != 1:
        sys.exit(f"{extract}/vocab: want one n{n}-v*.safetensors, found {[v.name for v in vocab]}")
    v = load_file(str(vocab[0]))
    d2t, t2d, counts = v["d2t"].long(), v["t2d"].bool(), v["counts"]
    train = [s for s in samples if not s["val"]]
    val = [s for s in samples if s["val"]]
    tdir = out / "target"
    norm_w = write_target(target, tdir)["model.norm.weight"].float()
    write_speculators(train + val, out / "spec", norm_w, d2t, t2d, counts)  # it trains on the first rows
    write_specforge(train, val, out / "sf", d2t, t2d, json.loads((tdir / "config.json").read_text()), len(d2t))
    ratio = (len(train) + 0.5) / n  # int(n * ratio) == len(train): speculators' split is draftlab's
    split = {"n_train": len(train), "n_val": len(val), "train_ratio": ratio, "layer_ids": manifest["layer_ids"],
             "hf_layer_ids": [k + 1 for k in manifest["layer_ids"]], "draft_vocab": len(d2t),
             "train_tokens": sum(len(s["ids"]) for s in train), "val_tokens": sum(len(s["ids"]) for s in val),
             "train_loss_tokens": sum(int(s["loss"].sum()) for s in train)}
    (out / "split.json").write_text(json.dumps(split, indent=1))
    print(json.dumps(split))


if __name__ == "__main__":
    main()

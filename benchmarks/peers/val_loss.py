"""Val/loss of every trained draft in RESULTS by draftlab's own evaluator, on the same validation samples.

    python benchmarks/peers/val_loss.py RESULTS SPLIT_JSON [--device cuda] [--batch-tokens 16384] [--ttt-steps 7]

Each trainer reports a loss of its own (speculators a KL per step, SpecForge a cross-entropy over its padded
batches, draftlab a decayed sum), on its own masks, so none of them is compared. Instead each run's draft is loaded
into draftlab's Eagle3Draft and scored by `Trainer.evaluate("val")` on the extract folder's validation split:
val/loss = sum over TTT steps j of 0.8^j x the mean soft cross-entropy against the teacher over the draft
vocabulary, with acc_j, full_acc_j and predicted_tau beside it. All three train the same graph (run.sh turns
speculators' extra norms off), so the weights load as they are:
- draftlab: dl/draft/model.safetensors (its export); speculators: ckpt/<last epoch>/model.safetensors (same key
  names); SpecForge: draft.safetensors (specforge_timed.py; `midlayer.` is layer 0, the frozen embedding it leaves
  out is the target's, from the extract folder);
- every weight is rounded to bf16, as draftlab's and speculators' exports are, so one rounding applies to all.
Writes RUN/val.json for each run folder whose rc is 0; prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from draftlab.data.features import HEAD_FILE, read_manifest  # noqa: E402
from draftlab.data.reader import FeatureSource, offline_entries  # noqa: E402
from draftlab.model.draft import DraftModelConfig, Eagle3Draft  # noqa: E402
from draftlab.train.loop import LoopSettings, Trainer  # noqa: E402


def draft_file(run: Path) -> tuple[str, Path] | None:
    """(trainer, weights file) of a run folder, or None when it holds no draft."""
    if (run / "dl" / "draft" / "model.safetensors").exists():
        return "draftlab", run / "dl" / "draft" / "model.safetensors"
    if (run / "draft.safetensors").exists():
        return "specforge", run / "draft.safetensors"
    epochs = [p for p in (run / "ckpt").glob("*/model.safetensors") if p.parent.name.isdigit()]
    if epochs:
        return "speculators", max(epochs, key=lambda p: int(p.parent.name))
    return None


def draftlab_state(state: dict[str, torch.Tensor], head: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A peer's draft weights under draftlab's names, bf16-rounded; the target embedding where it was left out."""
    out = {}
    for key, value in state.items():
        key = re.sub(r"^(model\.)?midlayer\.", "layers.0.", key.removeprefix("model."))
        out[key] = value.to(torch.bfloat16).float() if value.is_floating_point() else value
    out.setdefault("embed_tokens.weight", head["embed_tokens.weight"].to(torch.bfloat16).float())
    return out


def load_draft(path: Path, cfg: DraftModelConfig, head: dict, vocab: dict) -> tuple[Eagle3Draft, bool]:
    """The draft from `path`; also whether its d2t/t2d are the extract folder's (the same vocabulary for all)."""
    state = draftlab_state(load_file(str(path)), head)
    same_vocab = all(k in state and torch.equal(state[k].cpu(), vocab[k].to(state[k].dtype)) for k in ("d2t", "t2d"))
    state.setdefault("d2t", vocab["d2t"])
    state.setdefault("t2d", vocab["t2d"])
    model = Eagle3Draft(cfg)
    model.load_state_dict(state, strict=True)
    return model, same_vocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("split", type=Path)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--ttt-steps", type=int, default=7)
    args = ap.parse_args()
    split = json.loads(args.split.read_text())
    extract, n = Path(split["extract"]), int(split["n"])
    cfg = DraftModelConfig(**split["draft"])
    manifest = read_manifest(extract)
    source = FeatureSource(manifest, offline_entries(extract, manifest, n), extract, n, cfg.draft_vocab_size)
    head = load_file(str(extract / HEAD_FILE))
    d2t, t2d = source.vocab()
    settings = LoopSettings(max_steps=1, epochs=None, batch_tokens=args.batch_tokens, ttt_steps=args.ttt_steps,
                            max_seq_len=2048, device=args.device, compile_loss="false", compile_unroll="false")
    trainer = None
    tmp = tempfile.TemporaryDirectory(prefix="val-loss-")
    for run in sorted(p for p in args.results.iterdir() if p.is_dir()):
        found = draft_file(run)
        if found is None or (run / "rc").read_text().strip() != "0":
            continue
        name, path = found
        model, same_vocab = load_draft(path, cfg, head, {"d2t": d2t, "t2d": t2d})
        if trainer is None:  # one trainer: the validation batches are read (and on a GPU cached) once
            trainer = Trainer(model, source, head["lm_head.weight"], settings, Path(tmp.name))
        else:
            trainer.model.load_state_dict(model.state_dict())
        metrics = trainer.evaluate("val")
        record = {"run": run.name, "trainer": name, "draft": str(path), "same_vocab": same_vocab,
                  **{f"val/{k}": v for k, v in (metrics or {}).items()}}
        (run / "val.json").write_text(json.dumps(record, indent=1))
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items()
                          if not re.search(r"_[3-9]$", k)}), flush=True)


if __name__ == "__main__":
    main()

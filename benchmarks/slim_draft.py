"""A draft folder small enough for a transfer that caps its size: the tensors SGLang replaces or skips are left
out, and the rest is stored in bfloat16.

    python benchmarks/slim_draft.py outputs/train/<key>/draft slim-draft

Left out: `embed_tokens.weight` when SGLang takes the target's embedding instead (`target_hidden_size ==
hidden_size`: keymap's `shared_from_target`; for SmolLM2 that is 57 of its 76 MB in bf16) and `t2d` (skipped by
SGLang). The loader (serve/loader.py) then serves exactly what it served from the full folder; this script checks
that by loading both next to the target named by --target and comparing every parameter.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from draftlab.sglang.keymap import param_spec  # noqa: E402


def slim(src: Path, dst: Path) -> list[str]:
    """Writes the slim folder; returns the tensor names left out."""
    config = json.loads((src / "config.json").read_text())
    shared = {name.removeprefix("model.") for name in param_spec(config, "current").shared}
    state = load_file(str(src / "model.safetensors"))
    dropped = [k for k in state if k == "t2d" or k.removeprefix("model.") in shared]
    kept = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
            for k, v in state.items() if k not in dropped}
    dst.mkdir(parents=True, exist_ok=True)
    save_file(kept, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "draftlab_provenance.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dropped


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--target", default="smollm2", choices=("tiny", "smollm2"), help="to check the result against")
    ap.add_argument("--cache-dir", default="outputs/models")
    args = ap.parse_args(argv)
    dropped = slim(args.src, args.dst)

    from draftlab.config.config import default_config
    from draftlab.serve.loader import load_draft_like_sglang
    from draftlab.target.target import load_target

    cfg = default_config({"target": {"name": args.target, "device": "cpu", "dtype": "bfloat16"}})
    target = load_target(cfg.target, Path(args.cache_dir))
    full = load_draft_like_sglang(args.src, target.model, dtype=torch.bfloat16).model.state_dict()
    small = load_draft_like_sglang(args.dst, target.model, dtype=torch.bfloat16).model.state_dict()
    differ = [k for k in full if not torch.equal(full[k], small[k])]
    if differ:
        raise SystemExit(f"{args.dst}: serves differently from {args.src} in {differ}")
    size = (args.dst / "model.safetensors").stat().st_size / 2**20
    print(f"{args.dst}: {size:.1f} MiB, left out {dropped}; served identically in bfloat16")


if __name__ == "__main__":
    main()

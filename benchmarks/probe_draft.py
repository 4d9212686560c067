"""An untrained draft folder for measuring the engine's costs where no trained draft is at hand (CPU benches).

    python benchmarks/probe_draft.py --target smollm2 --out /tmp/probe-smollm2            # the default draft shape
    python benchmarks/probe_draft.py --target tiny --out /tmp/probe-tiny --agree           # tau > 1 on the tiny target

The draft has the pipeline's default shape (conf/draft: one layer, draft vocabulary `--draft-vocab`, the target's
widths), features from layers [1, L//2-1, L-1], and the target's embedding, final norm and head rows.
`--agree` makes it copy the last feature layer through `fc` with the decoder layer's output zeroed: its logits are
the target's own for the previous position, so it proposes "the last token again", which the tiny random target
often does (tau ~1.8 there; ~1 on real text). Without `--agree` the weights are random: tau ~1, and the run
measures what a cycle costs (cycle_ms) against a plain step (step_ms), which is what the speed-up at any tau
follows from. Never use it for acceptance numbers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from draftlab.config.config import default_config  # noqa: E402
from draftlab.sglang.export import export_draft  # noqa: E402
from draftlab.model.draft import Eagle3Draft  # noqa: E402
from draftlab.stages.train import draft_config  # noqa: E402
from draftlab.target.target import load_target  # noqa: E402


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2", choices=("tiny", "smollm2"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--draft-vocab", type=int, default=None, help="default: conf/draft's, capped at the vocab")
    ap.add_argument("--agree", action="store_true", help="copy the target's last layer (see above)")
    ap.add_argument("--cache-dir", default="outputs/models")
    args = ap.parse_args(argv)

    cfg = default_config({"target": {"name": args.target, "device": "cpu", "dtype": "float32"}})
    target = load_target(cfg.target, Path(args.cache_dir))
    m, L, H, V = target.model, target.num_layers, target.hidden_size, target.vocab_size
    vocab = min(args.draft_vocab or cfg.draft.vocab_size or V, V)
    manifest = {"target": {"config": m.config.to_dict(), "hidden_size": H}, "layer_ids": [1, L // 2 - 1, L - 1]}
    dcfg = draft_config(cfg.draft, manifest, vocab, cfg.train.max_seq_len)
    torch.manual_seed(0)
    draft = Eagle3Draft(dcfg)
    d2t, t2d = torch.zeros(vocab, dtype=torch.long), torch.zeros(V, dtype=torch.bool)
    t2d[:vocab] = True  # draft id i = target id i
    with torch.no_grad():
        draft.init_from_target(m.get_input_embeddings().weight, m.lm_head.weight, d2t, t2d)
        draft.norm.weight.copy_(m.model.norm.weight)
        if args.agree:
            draft.fc.weight.zero_()
            draft.fc.weight[:, 2 * H:] = torch.eye(H)
            draft.layers[0].self_attn.o_proj.weight.zero_()
            draft.layers[0].mlp.down_proj.weight.zero_()
    folder = export_draft(draft, dcfg, args.out, "float32")
    print(folder)
    return folder


if __name__ == "__main__":
    main()

"""Loads an exported draft folder the way SGLang would, so the local engine serves the artifact a user deploys.

The tensors come through `draftlab.sglang.keymap.load_like_sglang`, which replays SGLang's key mapping:
a key SGLang drops silently is absent here too. Then SGLang's start-up is mimicked:
- a parameter no key wrote keeps a deterministic garbage value (zeros: SGLang's is `torch.empty`), so a
  draft that SGLang would serve at accept length ~1 is served at ~1 here as well;
- the embedding is replaced by the target's when `target_hidden_size == hidden_size` (`set_embed`), and
  the head is the target's when `draft_vocab_size` is null (`load_lm_head_from_target`);
- `tie_word_embeddings: true` makes the head the first draft_vocab rows of the (target) embedding;
- no `d2t` -> draft ids are used directly as target ids (`hot_token_id` None);
- feature layers are `eagle_config.eagle_aux_hidden_state_layer_ids` in ascending order with duplicates
  collapsed (SGLang captures layers in a loop), or SGLang's default [1, L//2-1, L-4] when absent.
A shape mismatch, which makes SGLang fail at load, raises `DraftLoadError` here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftlab.model.draft import DraftModelConfig, Eagle3Draft


class DraftLoadError(RuntimeError):
    """The draft folder would make SGLang fail at start-up (the message says why)."""


@dataclass
class LoadedDraft:
    model: Eagle3Draft  # eval mode, on the target's device and in the serving dtype
    config: dict  # config.json as written
    feature_layers: tuple[int, ...]  # target layers the engine must capture (output of layer k)
    report: object  # keymap.KeyReport: what SGLang would have dropped / never loaded
    garbage: list[str]  # our parameter names that kept the garbage init (nothing loaded them)

    @property
    def has_d2t(self) -> bool:
        return bool(self.report.has_d2t)

    def problems(self) -> list[str]:
        """Human-readable lines: what SGLang would silently mis-load (empty for a healthy draft)."""
        lines = list(self.report.lines())
        if not self.has_d2t and self.model.cfg.draft_vocab_size < self.model.cfg.vocab_size:
            lines.append(f"no d2t: draft ids 0..{self.model.cfg.draft_vocab_size - 1} are used as target ids")
        return lines


def sglang_feature_layers(config: dict, num_target_layers: int, target_config: dict | None = None) -> tuple[int, ...]:
    """The target layers whose outputs SGLang feeds this draft (output of layer k = HF hidden_states[k+1]): the
    draft's ids (SGLang's default when it names none) through the target architecture's capture contract."""
    from draftlab.sglang.capture import for_target, llama

    capture = for_target(target_config, allow_unlisted=True) if target_config else llama()
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        ids = capture.default_ids(num_target_layers)  # SGLang's default capture
    ids = sorted(set(int(i) for i in ids))
    return tuple(c - 1 for c in capture.points(ids, num_target_layers))


def load_draft_like_sglang(folder: Path | str, target_model, rules: str = "current",
                           dtype: torch.dtype | None = None) -> LoadedDraft:
    """The draft in `folder` as SGLang would serve it next to `target_model` (a transformers causal LM)."""
    from draftlab.sglang.keymap import arch_from_config, load_like_sglang

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    arch = arch_from_config(config, rules)
    state, report = load_like_sglang(folder, rules)
    if report.mismatches:
        raise DraftLoadError(f"{folder}: SGLang would fail at load: " + "; ".join(
            line for line in report.lines() if line.startswith("shape mismatch")))

    tcfg = target_model.config
    layers = sglang_feature_layers(config, tcfg.num_hidden_layers, tcfg.to_dict())
    if len(layers) * tcfg.hidden_size != arch.num_aux * arch.hidden_in:
        raise DraftLoadError(
            f"{folder}: fc expects {arch.num_aux} x {arch.hidden_in} features, the target gives "
            f"{len(layers)} layers {list(layers)} x {tcfg.hidden_size} (SGLang fails at the first forward)")
    if arch.vocab != tcfg.vocab_size:
        raise DraftLoadError(f"{folder}: vocab_size {arch.vocab} != the target's {tcfg.vocab_size}")

    cfg = DraftModelConfig.from_hf_config(config)
    cfg.aux_layer_ids = list(layers)
    model = Eagle3Draft(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.d2t.zero_()  # absent d2t = identity: draft id i is target id i
        missing, unexpected = model.load_state_dict(state, strict=False)
    garbage = [name for name in missing if name not in ("d2t", "t2d")]
    if unexpected:  # keymap only returns names of parameters SGLang has; ours must have them too
        raise DraftLoadError(f"{folder}: tensors with no place in the draft: {unexpected}")

    with torch.no_grad():
        target_embed = target_model.get_input_embeddings().weight
        if "model.embed_tokens.weight" in report.shared_from_target:
            model.embed_tokens.weight.copy_(target_embed.float())
            garbage = [g for g in garbage if g != "embed_tokens.weight"]
        if arch.tied:  # SGLang: lm_head *is* embed_tokens; the logits use its first draft_vocab rows
            model.lm_head.weight.copy_(model.embed_tokens.weight[: cfg.draft_vocab_size])
            garbage = [g for g in garbage if g != "lm_head.weight"]
        elif "lm_head.weight" in report.shared_from_target:
            model.lm_head.weight.copy_(target_model.get_output_embeddings().weight.float())
            garbage = [g for g in garbage if g != "lm_head.weight"]
    device = next(target_model.parameters()).device
    model = model.to(device=device, dtype=dtype or next(target_model.parameters()).dtype).eval()
    return LoadedDraft(model, config, layers, report, garbage)

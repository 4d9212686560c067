"""The extract stage's format (`draftlab.features/1`): what a features folder holds, the capture of the target's
hidden states that fills it, and its index. Training reads it through data/reader.py (FeatureSource), kept apart so
that a change to the reader leaves the extract stage's code version, and so every pool, as it is.

A features folder holds `manifest.json` (complete shards only; rewritten after each shard), `shard-NNNNN.safetensors`
(the generate tensors of its samples plus `features` [T, n_layers*H] and `last_hidden` [T, H] in `extract.dtype`,
and `target_top` int32 [T], the full-vocabulary argmax where training reads it and 0 elsewhere (`stored_top1`), when
the manifest says `"target_top": true`),
`target_head.safetensors` (fp32 `embed_tokens.weight`, `lm_head.weight`) and `vocab/n{N}-v{V}.safetensors`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from draftlab.model.attention import variable_shape_attention
from draftlab.data.samples import SPLITS
from draftlab.util.fsutil import read_json

FORMAT = "draftlab.features/1"
HEAD_FILE = "target_head.safetensors"
SMALL_TENSORS = ("input_ids", "loss_mask", "target_top")  # 9 bytes a token: the loss mask copied when a shard opens
WIDE_TENSORS = ("features", "last_hidden")  # 4.6 kB a token (SmolLM2, bf16): only the batch's rows are ever read


def read_manifest(folder: Path) -> dict | None:
    manifest = read_json(Path(folder) / "manifest.json")
    if manifest is not None and manifest.get("format") != FORMAT:
        raise ValueError(f"{folder}/manifest.json: not a features folder (format {manifest.get('format')!r})")
    return manifest


class HiddenTap:
    """Runs the target body (`model.model`, no lm_head) and returns the chosen layers' outputs plus the normed state.

    Forward hooks on `layers[k]` copy each chosen output into one preallocated [B, T, nL*H] buffer as soon as it
    is produced, so no other layer's activation is kept alive (output_hidden_states would hold all L+1) and no
    torch.cat copy is needed; the copy also casts to the output dtype on the device.
    """

    def __init__(self, model: torch.nn.Module, layer_ids: list[int], points: list[int] | None = None):
        self.body = model.model
        self.layer_ids = list(layer_ids)
        # capture point c = the stream entering layer c: the embedding output for c = 0, else layer c-1's output
        self.points = [k + 1 for k in self.layer_ids] if points is None else list(points)
        self.hidden = model.config.hidden_size
        self.head_weight = model.get_output_embeddings().weight

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """`attention_mask` None = nothing padded (decided on the host: checking a CUDA mask would sync), which
        also keeps SDPA on its causal fast path."""
        B, T = input_ids.shape
        H = self.hidden
        buf = torch.empty(B, T, len(self.layer_ids) * H, dtype=dtype, device=input_ids.device)

        def copy(slot: int, _module, _args, output):
            out = output[0] if isinstance(output, tuple) else output
            buf[..., slot * H:(slot + 1) * H].copy_(out)

        handles = [(self.body.layers[c - 1] if c > 0 else self.body.embed_tokens).register_forward_hook(
            functools.partial(copy, j)) for j, c in enumerate(self.points)]
        try:
            with variable_shape_attention():  # padded lengths vary from batch to batch
                out = self.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        # with target.device_map the last layer may sit on another GPU than the input
        return buf, out.last_hidden_state.to(device=input_ids.device, dtype=dtype)


@torch.inference_mode()
def head_top1(last_hidden: torch.Tensor, head_weight: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """int32 argmax over the full vocabulary of `last_hidden @ head_weight.T`, from the hidden state as stored
    and the head in the target's dtype: the argmax training's plain path forms, kept at 4 bytes a token so that
    training builds its soft targets from the draft rows of the head only (train/ttt.py)."""
    flat = last_hidden.reshape(-1, last_hidden.shape[-1])
    # under target.device_map the head may sit on another GPU than the final norm's output
    tops = [(rows.to(head_weight.device, head_weight.dtype) @ head_weight.T).argmax(-1).to(torch.int32)
            for rows in flat.split(chunk)]
    if not tops:
        return flat.new_zeros(last_hidden.shape[:-1], dtype=torch.int32)
    return torch.cat(tops).to(last_hidden.device).view(last_hidden.shape[:-1])


def read_positions(loss_masks: list[torch.Tensor], T: int) -> torch.Tensor:
    """Flat indices into a [len(loss_masks), T] batch of the positions whose target training reads: s where the
    next token, s + 1, is an answer token (train/ttt.py: step j at t reads the target at s = t+1+j only when
    loss_mask[s+1]). Each mask is its sample's whole one, so a sample cut to T tokens keeps its last position's
    answer; from host-side masks, so nothing is read back from the device."""
    rows = [m[1:T + 1].nonzero().squeeze(1) + i * T for i, m in enumerate(loss_masks)]
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)


@torch.inference_mode()
def stored_top1(last_hidden: torch.Tensor, head_weight: torch.Tensor, loss_masks: list[torch.Tensor]) -> torch.Tensor:
    """`target_top` as stored: `head_top1` at the `read_positions` only, 0 at the others (no loss or accuracy ever
    looks there). On ShareGPT answers are about 61% of the tokens, so this drops about 2/5 of the [N, 576] x
    [576, 49152] matmul that cost extraction 7-8% of the target's forward on an H200."""
    B, T, H = last_hidden.shape
    index = read_positions(loss_masks, T)
    if last_hidden.is_cuda:  # pinned, so the copy does not wait for the forward queued ahead of it
        index = index.pin_memory().to(last_hidden.device, non_blocking=True)
    top = torch.zeros(B * T, dtype=torch.int32, device=last_hidden.device)
    top[index] = head_top1(last_hidden.reshape(B * T, H).index_select(0, index), head_weight)
    return top.view(B, T)


def pad_batch(seqs: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pads 1-D id tensors into [B, T] plus the bool attention mask (see `model_mask`)."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = True
    return ids, mask


def model_mask(seqs: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor | None:
    """The mask to give the model: None when all lengths are equal (decided from host-side lengths)."""
    return None if len({len(s) for s in seqs}) == 1 else mask


@dataclass
class Entry:
    """One sample as training reads it: where it lies in the pool (offline), or its tokens (online)."""
    sample_index: int
    split: str
    length: int
    shard: int = -1  # offline: shard number and token offset inside it
    start: int = 0
    ids: torch.Tensor | None = None  # online: the token ids (int32) and the assistant mask
    loss_mask: torch.Tensor | None = None


def target_head(target) -> dict[str, torch.Tensor]:
    model = target.model
    return {"embed_tokens.weight": model.get_input_embeddings().weight.detach().float().cpu().clone(),
            "lm_head.weight": model.get_output_embeddings().weight.detach().float().cpu().clone()}


def offline_entries(folder: Path, manifest: dict, limit: int) -> list[Entry]:
    """The first `limit` samples of a features folder, from the shards' small tensors only (offsets, split)."""
    if manifest["num_samples"] < limit:
        raise ValueError(f"{folder}: {limit} samples asked for, {manifest['num_samples']} extracted")
    entries: list[Entry] = []
    for number, shard in enumerate(manifest["shards"]):
        if shard["first"] >= limit:
            break
        with safe_open(str(Path(folder) / f"{shard['name']}.safetensors"), framework="pt") as f:
            offsets = f.get_tensor("offsets").tolist()
            index = f.get_tensor("sample_index").tolist()
            split = f.get_tensor("split").tolist()
        for i, sample_index in enumerate(index):
            if sample_index < limit:
                entries.append(Entry(sample_index, SPLITS[split[i]], offsets[i + 1] - offsets[i], number, offsets[i]))
    return entries


def target_info(target) -> dict:
    return {"name": target.name, "fingerprint": target.fingerprint, "config": target.config_dict(),
            "hidden_size": target.hidden_size, "num_layers": target.num_layers, "vocab_size": target.vocab_size}

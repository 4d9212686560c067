"""The generate stage's output: token ids, assistant masks and text, in shards that are written atomically.

A folder holds `manifest.json` (format `draftlab.samples/1`) listing complete shards only; a shard file that is
not in the manifest is a leftover of a killed run and is overwritten. Sample i is prompt i of the deterministic
prompt order, so a folder grown from N to 2N samples keeps its first N samples byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch
from safetensors.torch import load_file

from draftlab.util.fsutil import atomic_save_safetensors, atomic_write_json, atomic_write_text, read_json

FORMAT = "draftlab.samples/1"
SPLITS = ("train", "val")


@dataclass
class Sample:
    index: int
    input_ids: torch.Tensor  # int64 [T]: chat-templated prompt + answer
    loss_mask: torch.Tensor  # bool [T]: True on answer tokens
    split: str  # train | val
    prompt: str = ""
    response: str = ""
    conversation_id: str = ""

    @property
    def prompt_len(self) -> int:
        """Tokens before the answer (the whole sample when it has no answer tokens)."""
        answer = self.loss_mask.nonzero()
        return int(answer[0]) if len(answer) else len(self.loss_mask)


def shard_name(number: int) -> str:
    return f"shard-{number:05d}"


def pack(samples: list[Sample]) -> dict[str, torch.Tensor]:
    """Flattens variable-length samples into one tensor per field plus offsets."""
    lengths = torch.tensor([len(s.input_ids) for s in samples], dtype=torch.int64)
    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    return {
        "input_ids": torch.cat([s.input_ids for s in samples]).to(torch.int32),
        "loss_mask": torch.cat([s.loss_mask for s in samples]).to(torch.uint8),
        "offsets": offsets,
        "sample_index": torch.tensor([s.index for s in samples], dtype=torch.int64),
        "split": torch.tensor([SPLITS.index(s.split) for s in samples], dtype=torch.uint8),
    }


def unpack(tensors: dict[str, torch.Tensor]) -> Iterator[tuple[int, str, slice]]:
    """Yields (sample index, split, token slice) for each sample of a packed shard."""
    offsets = tensors["offsets"].tolist()
    for i, index in enumerate(tensors["sample_index"].tolist()):
        yield index, SPLITS[int(tensors["split"][i])], slice(offsets[i], offsets[i + 1])


class SampleWriter:
    """Appends shards to a samples folder; the manifest is rewritten after each shard, so a kill loses at most
    the shard being written."""

    def __init__(self, folder: Path, fingerprint: str, meta: dict | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        manifest = read_manifest(self.folder)
        if manifest and manifest["fingerprint"] != fingerprint:
            raise ValueError(
                f"{self.folder}: holds samples made with fingerprint {manifest['fingerprint']}, not {fingerprint}; "
                "use another folder"
            )
        self.manifest = manifest or {"format": FORMAT, "fingerprint": fingerprint, "num_samples": 0,
                                     "tokens": 0, "shards": [], "meta": meta or {}}

    @property
    def num_samples(self) -> int:
        return self.manifest["num_samples"]

    def write_shard(self, samples: list[Sample]) -> None:
        if not samples:
            return
        if samples[0].index != self.num_samples:
            raise ValueError(f"shard starts at sample {samples[0].index}, expected {self.num_samples}")
        name = shard_name(len(self.manifest["shards"]))
        atomic_save_safetensors(self.folder / f"{name}.safetensors", pack(samples))
        lines = [json.dumps({"index": s.index, "split": s.split, "conversation_id": s.conversation_id,
                             "prompt": s.prompt, "response": s.response}, ensure_ascii=False) for s in samples]
        atomic_write_text(self.folder / f"{name}.jsonl", "\n".join(lines) + "\n")
        tokens = sum(len(s.input_ids) for s in samples)
        self.manifest["shards"].append({"name": name, "samples": len(samples), "tokens": tokens,
                                        "answer_tokens": int(sum(int(s.loss_mask.sum()) for s in samples))})
        self.manifest["num_samples"] += len(samples)
        self.manifest["tokens"] += tokens
        atomic_write_json(self.folder / "manifest.json", self.manifest)


def read_manifest(folder: Path) -> dict | None:
    manifest = read_json(Path(folder) / "manifest.json")
    if manifest is not None and manifest.get("format") != FORMAT:
        raise ValueError(f"{folder}/manifest.json: not a samples folder (format {manifest.get('format')!r})")
    return manifest


def count_samples(folder: Path) -> int:
    manifest = read_manifest(folder)
    return manifest["num_samples"] if manifest else 0


def read_samples(folder: Path, limit: int | None = None, split: str | None = None,
                 with_text: bool = False) -> Iterator[Sample]:
    """The first `limit` samples of the folder (all if None), optionally only one split, in index order."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        raise FileNotFoundError(f"{folder}: no samples manifest.json (did the generate stage run?)")
    if limit is not None and limit > manifest["num_samples"]:
        raise ValueError(f"{folder}: {limit} samples asked for, {manifest['num_samples']} available")
    for shard in manifest["shards"]:
        tensors = load_file(str(folder / f"{shard['name']}.safetensors"))
        texts = _read_texts(folder / f"{shard['name']}.jsonl") if with_text else {}
        for index, sample_split, span in unpack(tensors):
            if limit is not None and index >= limit:
                return
            if split is not None and sample_split != split:
                continue
            text = texts.get(index, {})
            yield Sample(index, tensors["input_ids"][span].long(), tensors["loss_mask"][span].bool(),
                         sample_split, text.get("prompt", ""), text.get("response", ""),
                         text.get("conversation_id", ""))


def val_prompts(folder: Path, count: int, limit: int | None = None) -> list[list[int]]:
    """The prompt ids of the first `count` validation samples among the first `limit` (a job's data.samples): the
    same prompts whatever other jobs have added to a shared pool meanwhile; fewer when the split holds fewer."""
    limit = None if limit is None else min(limit, count_samples(Path(folder)))
    prompts = []
    for sample in read_samples(Path(folder), limit=limit, split="val"):
        prompts.append(sample.input_ids[: sample.prompt_len].tolist())
        if len(prompts) == count:
            break
    return prompts


def _read_texts(path: Path) -> dict[int, dict]:
    # "\n" only: str.splitlines also splits at U+2028 and other breaks that ensure_ascii=False leaves in a text
    records = (json.loads(line) for line in path.read_text().split("\n") if line.strip())
    return {r["index"]: r for r in records}


def write_samples(folder: Path, samples: Iterable[Sample], fingerprint: str = "test", shard_size: int = 64) -> None:
    """Writes a whole samples folder at once (tests and tools); the generate stage uses SampleWriter directly."""
    writer = SampleWriter(folder, fingerprint)
    batch: list[Sample] = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == shard_size:
            writer.write_shard(batch)
            batch = []
    writer.write_shard(batch)

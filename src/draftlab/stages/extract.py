"""The extract stage: target features at the chosen layers for the first `data.samples` samples, and the vocab.

`out` is a pool shared by every `data.samples` (its fingerprint leaves the count out): shards listed in the
manifest are kept, only the missing samples are extracted, one shard at a time, so memory stays flat whatever
the data size (the model, one shard being computed and one being written). The target is loaded only if work
remains; `extract.layers` is resolved (and refused) before that, from the target's config alone.
"""

from __future__ import annotations

import errno
import logging
import shutil
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

# under DVC's fixed folder, new code must not extend old features
from draftlab.provenance.code_version import code_version
from draftlab.data import samples as samples_fmt
from draftlab.data.features import (FORMAT, HEAD_FILE, HiddenTap, model_mask, offline_entries, pad_batch,
                                    read_manifest, stored_top1, target_head, target_info)
from draftlab.data.layers import (CONVENTION, LAST_WARNING, capture_points, num_target_layers, resolve_layers,
                                  sglang_servable, spec_name, target_capture)
from draftlab.data.pool import pool_size
from draftlab.data.room import estimated_bytes_per_token, free_bytes, room_needed
from draftlab.data.vocab import count_tokens, vocab_name, vocab_path, write_vocab
from draftlab.util.fsutil import atomic_save_safetensors, atomic_write_json
from draftlab.util.progress import bar

log = logging.getLogger("draftlab.extract")
def extract_batch(tap: HiddenTap, batch: list, dtype: torch.dtype, device) -> list[tuple[torch.Tensor, ...]]:
    """(features [T_i, nL*H], last_hidden [T_i, H], target_top [T_i]) per sample, on the device; the first two in
    the storage dtype, the last the int32 full-vocabulary argmax of the stored last_hidden where training reads it
    (features.stored_top1).

    Per-sample slices use lengths known on the host, so no boolean gather (and no device->host sync) happens here.
    """
    seqs = [s.input_ids for s in batch]
    ids, mask = pad_batch(seqs)
    mask = model_mask(seqs, mask)
    features, last = tap(ids.to(device), None if mask is None else mask.to(device), dtype)
    top = stored_top1(last, tap.head_weight, [s.loss_mask for s in batch])
    return [(features[i, :len(s.input_ids)], last[i, :len(s.input_ids)], top[i, :len(s.input_ids)])
            for i, s in enumerate(batch)]


def length_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices into `lengths`, sorted by length and cut into batches of `batch_size`: how a shard is batched (each
    batch padded to its longest, so similar lengths together pad least)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


def extract_shard(tap: HiddenTap, shard: list, batch_size: int, dtype: torch.dtype, device, on_batch=None) -> dict:
    """The shard's packed sample tensors plus `features` / `last_hidden` / `target_top` (still on the device).

    Samples are batched by length (`length_batches`) and put back in index order. `on_batch(n)` after each batch
    (the progress bar).
    """
    results: list = [None] * len(shard)
    for chunk in length_batches([len(s.input_ids) for s in shard], batch_size):
        for i, triple in zip(chunk, extract_batch(tap, [shard[i] for i in chunk], dtype, device)):
            results[i] = triple
        if on_batch is not None:
            on_batch(len(chunk))
    tensors = samples_fmt.pack(shard)
    for slot, key in enumerate(("features", "last_hidden", "target_top")):
        tensors[key] = torch.cat([r[slot] for r in results])
    return tensors


def start_host_copy(tensors: dict) -> tuple[dict, list]:
    """Starts the device->host copies of a shard on a side stream into pinned memory and returns (host tensors,
    events). The caller keeps computing; the writer thread waits on the events only. A plain `.cpu()` on the writer
    thread would instead wait for everything queued on the main stream (the next shard's forward included).
    Pinned buffers come from torch's caching host allocator, so two shards in flight reuse two sets of buffers.
    One side stream per GPU: under target.device_map the tensors of one shard can sit on several."""
    host, streams = dict(tensors), {}
    for key, t in tensors.items():
        if not t.is_cuda:
            continue
        side = _copy_stream(t.device)
        if t.device not in streams:  # the copies start after what the main stream has queued (the forward)
            side.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(side):
            host[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
            t.record_stream(side)  # the caching allocator must not reuse t before the copy ran
        streams[t.device] = side
    events = []
    for side in streams.values():
        event = torch.cuda.Event()
        event.record(side)
        events.append(event)
    return host, events


_COPY_STREAMS: dict = {}


def _copy_stream(device):
    if device not in _COPY_STREAMS:
        _COPY_STREAMS[device] = torch.cuda.Stream(device=device)
    return _COPY_STREAMS[device]


class ShardWriter:
    """Writes shards on `writers` background threads (device->host copy + safetensors write overlap the next
    shard's forward). A shard waits for a free writer, so host memory holds `writers` + 1 shards at most. Files
    may finish out of order; the manifest takes them in order (the main thread records each finished write), so a
    resumed run never sees a gap: a file written past the manifest's last shard is written again under its name.

    On the H200 machine's disk two and four writers were slower than one. Into memory (/dev/shm) one and four
    took the same time in the stage, bound then by cuDNN's attention planning; one thread filled tmpfs at 1.5-2
    GB/s on the dev machine, below the ~2.2 GB/s extraction needs at the forward's pace, hence the GPU preset's
    four (BENCHMARKS.md, "Extraction against a plain forward")."""

    def __init__(self, out: Path, manifest: dict, writers: int = 1):
        if writers < 1:
            raise ValueError(f"extract.writers={writers}: at least 1")
        self.out, self.manifest, self.writers = out, manifest, writers
        self.pool = ThreadPoolExecutor(max_workers=writers, thread_name_prefix="draftlab-shard-writer")
        self.pending: deque[tuple[Future, dict]] = deque()

    def submit(self, tensors: dict, seconds: float) -> None:
        while len(self.pending) >= self.writers:
            self._record_oldest()
        host, events = start_host_copy(tensors)  # sample_index and input_ids are host tensors already
        name = samples_fmt.shard_name(len(self.manifest["shards"]) + len(self.pending))
        entry = {"name": name, "first": int(host["sample_index"][0]), "samples": len(host["sample_index"]),
                 "tokens": len(host["input_ids"]), "seconds": seconds}
        self.pending.append((self.pool.submit(self._write, self.out / f"{name}.safetensors", host, events), entry))

    def wait(self) -> None:
        while self.pending:
            self._record_oldest()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            for future, _ in self.pending:  # after a write error: the shards behind it are not recorded
                future.cancel()
            self.pool.shutdown()

    def _record_oldest(self) -> None:
        future, entry = self.pending[0]
        entry["bytes"] = future.result()  # re-raises a write error in the main thread
        self.pending.popleft()
        self.manifest["shards"].append(entry)
        self.manifest["num_samples"] += entry["samples"]
        _totals(self.manifest)
        atomic_write_json(self.out / "manifest.json", self.manifest)

    @staticmethod
    def _write(path: Path, host: dict, events: list) -> int:
        for event in events:
            event.synchronize()
        atomic_save_safetensors(path, host, metadata={"format": FORMAT})
        return path.stat().st_size


def _totals(manifest: dict) -> None:
    shards = manifest["shards"]
    manifest["tokens"] = sum(s["tokens"] for s in shards)
    manifest["bytes"] = sum(s["bytes"] for s in shards)
    manifest["bytes_per_token"] = manifest["bytes"] / manifest["tokens"] if manifest["tokens"] else 0.0


def new_manifest(cfg, target, layer_ids: list[int], samples_fingerprint: str, points: list[int], capture) -> dict:
    width = len(layer_ids) * target.hidden_size
    return {"format": FORMAT, "mode": cfg.extract.mode, "layer_ids": layer_ids, "capture_points": points,
            "capture": capture.describe(),
            "layers_spec": spec_name(cfg.extract.layers), "sglang_servable": sglang_servable(cfg.extract.layers),
            "warning": None if sglang_servable(cfg.extract.layers) else LAST_WARNING,
            "convention": CONVENTION, "dtype": cfg.extract.dtype, "target": target_info(target),
            "samples_fingerprint": samples_fingerprint, "code_version": code_version("extract"),
            "shapes": {"features": [-1, width], "last_hidden": [-1, target.hidden_size]},
            # shards hold the int32 full-vocabulary argmax where training reads it: its fast soft targets
            "target_top": True,
            "num_samples": 0, "tokens": 0, "bytes": 0, "bytes_per_token": 0.0, "shards": [], "vocabs": {}}


def _check_pool(out: Path, manifest: dict, cfg, layer_ids: list[int], points: list[int],
                samples_fingerprint: str) -> None:
    """A pool only grows with the same settings; anything else is a fingerprinting bug, not something to mix."""
    wanted = {"layer_ids": layer_ids, "capture_points": points, "dtype": cfg.extract.dtype, "mode": cfg.extract.mode,
              "samples_fingerprint": samples_fingerprint, "code_version": code_version("extract")}
    wrong = {k: (manifest.get(k), v) for k, v in wanted.items() if manifest.get(k) != v}
    if wrong:
        raise ValueError(f"{out}: holds features made with other settings {wrong} (stored, asked); use another folder")


def _empty_pool(out: Path) -> None:
    for path in [*out.glob("shard-*"), out / HEAD_FILE, out / "manifest.json"]:
        path.unlink(missing_ok=True)
    shutil.rmtree(out / "vocab", ignore_errors=True)


def run(cfg, out: Path, inputs: dict[str, Path], reporter) -> dict:
    out, samples_dir = Path(out), Path(inputs["generate"])
    n = pool_size(cfg.data)
    samples_manifest = samples_fmt.read_manifest(samples_dir)
    if samples_manifest is None or samples_manifest["num_samples"] < n:
        raise FileNotFoundError(f"{samples_dir}: fewer than {n} generated samples (data.samples + data.val_samples)")
    # Resolved from config.json / GGUF header: a bad extract.layers fails before any weights are read.
    num_layers = num_target_layers(cfg.target, Path(cfg.paths.root) / "models")
    capture = target_capture(cfg.target, cfg.serve.sglang_version)
    layer_ids = resolve_layers(cfg.extract.layers, num_layers, capture)
    points = capture_points(cfg.extract.layers, layer_ids, num_layers, capture)
    out.mkdir(parents=True, exist_ok=True)
    for leftover in out.rglob(".*.tmp"):  # a killed atomic write; the pipeline's lock keeps writers apart
        leftover.unlink()
    manifest = read_manifest(out)
    if manifest is not None:
        try:
            _check_pool(out, manifest, cfg, layer_ids, points, samples_manifest["fingerprint"])
        except ValueError as err:  # DVC keeps one folder whatever the settings: start it over, never mix
            log.warning("extract: %s; starting the pool over", err)
            _empty_pool(out)
            manifest = None
    offline = cfg.extract.mode == "offline"
    done = manifest["num_samples"] if manifest else 0
    loads_target = manifest is None or not (out / HEAD_FILE).exists() or (offline and done < n)
    if loads_target:
        from draftlab.target.target import load_target

        target = load_target(cfg.target, Path(cfg.paths.root) / "models")
        if target.num_layers != num_layers:  # the cheap config read disagreed with the model: trust neither
            raise ValueError(f"target has {target.num_layers} layers, its config said {num_layers}")
        if manifest is None:
            manifest = new_manifest(cfg, target, layer_ids, samples_manifest["fingerprint"], points, capture)
        elif manifest["target"]["fingerprint"] != target.fingerprint:
            raise ValueError(f"{out}: features of target {manifest['target']['fingerprint']}, "
                             f"not {target.fingerprint}; use another folder")
        atomic_save_safetensors(out / HEAD_FILE, target_head(target))
        if offline and done < n:
            _check_room(cfg, out, manifest, _tokens_between(samples_manifest, done, n), n - done)
            _extract(cfg, out, samples_dir, manifest, target, layer_ids, done, n, reporter)
    metrics = _finish(cfg, out, samples_dir, manifest, n, reporter)
    # what `invoke` reads to call the stage cached. Online stores no samples: it did work only if it loaded the target
    # (a new pool's manifest and head), and then the metric is left out, not 0
    if offline:
        metrics["extract/new_samples"] = float(max(0, n - done))
    elif not loads_target:
        metrics["extract/new_samples"] = 0.0
    reporter.tag("extract.layer_ids", ",".join(map(str, layer_ids)))
    reporter.tag("extract.sglang_servable", str(manifest["sglang_servable"]).lower())
    return metrics


def _tokens_between(samples_manifest: dict, first: int, stop: int) -> int:
    """Tokens of samples [first, stop), from the samples manifest's per-shard counts (pro rata in a shard)."""
    tokens, start = 0.0, 0
    for shard in samples_manifest["shards"]:
        end = start + shard["samples"]
        overlap = min(end, stop) - max(start, first)
        if overlap > 0:
            tokens += shard["tokens"] * overlap / shard["samples"]
        start = end
    return int(tokens)


def _check_room(cfg, out: Path, manifest: dict, tokens: int, samples: int) -> None:
    """Refuses to start an extraction that cannot fit (data/room.py's estimate), naming the setting that chose the
    place."""
    per_token = estimated_bytes_per_token(manifest)
    free, in_memory = free_bytes(out)
    need = room_needed(tokens, samples, per_token, in_memory, cfg.extract.shard_size, cfg.extract.writers)
    key = "extract.pool_root" if cfg.extract.pool_root else "paths.root"
    where = "memory (tmpfs: the smaller of its free space and the host's available memory)" if in_memory else "disk"
    if need > free:
        raise OSError(errno.ENOSPC, f"{key}: extracting {tokens:,} tokens into {out} needs about {need / 1e9:.1f} "
                      f"GB, and its {where} has {free / 1e9:.1f} GB free; point {key} at a larger place"
                      + (" (extract.pool_root=null keeps the pool under paths.root)" if in_memory else ""))
    log.info("extract: about %.1f GB into %s, %s with %.1f GB free%s", need / 1e9, out, where, free / 1e9,
             "; the pool holds that memory until it is deleted (or the host restarts)" if in_memory else "")


def _extract(cfg, out: Path, samples_dir: Path, manifest: dict, target, layer_ids: list[int], done: int, n: int,
             reporter) -> None:
    tap = HiddenTap(target.model, layer_ids, manifest["capture_points"])
    dtype = getattr(torch, cfg.extract.dtype)
    writer = ShardWriter(out, manifest, cfg.extract.writers)
    shard: list = []
    start = time.perf_counter()
    progress = bar(n - done, "extract", "sample")
    try:  # the shards written are recorded whatever happens; an error of the loop is the one raised
        for sample in samples_fmt.read_samples(samples_dir, limit=n):
            if sample.index < done:
                continue
            shard.append(sample)
            if len(shard) == cfg.extract.shard_size or sample.index == n - 1:
                tensors = extract_shard(tap, shard, cfg.extract.batch_size, dtype, target.device, progress.update)
                now = time.perf_counter()
                writer.submit(tensors, now - start)
                start, shard = now, []
                reporter.metrics({"extract/progress_samples": float(sample.index + 1)}, step=sample.index + 1)
    except BaseException:
        try:
            writer.close()
        except Exception as err:  # noqa: BLE001 - secondary (or the same write error again): the first follows
            log.warning("extract: closing the shard writer after the error: %s", err)
        raise
    finally:
        progress.close()
    writer.close()
    log.info("extracted samples %d..%d into %s", done, n - 1, out)


def _finish(cfg, out: Path, samples_dir: Path, manifest: dict, n: int, reporter) -> dict:
    """The vocab for (N, V) if missing, the manifest last, and the metrics for the first N samples."""
    v = int(cfg.draft.vocab_size)
    path = vocab_path(out, n, v)
    if vocab_name(n, v) not in manifest["vocabs"] or not path.exists():
        counts = count_tokens(samples_fmt.read_samples(samples_dir, limit=n, split="train"),
                              manifest["target"]["vocab_size"])
        manifest["vocabs"][vocab_name(n, v)] = write_vocab(path, counts, v)
    _totals(manifest)
    atomic_write_json(out / "manifest.json", manifest)
    if manifest["mode"] == "offline":
        entries = offline_entries(out, manifest, n)
        tokens = sum(e.length for e in entries)
        used = [s for s in manifest["shards"] if s["first"] < n]
        seconds = sum(s["seconds"] for s in used)
        rate = sum(s["tokens"] for s in used) / seconds if seconds else 0.0
        nbytes = manifest["bytes_per_token"] * tokens  # shards can straddle N: bytes pro rata
    else:
        tokens = sum(len(s.input_ids) for s in samples_fmt.read_samples(samples_dir, limit=n))
        rate, nbytes = 0.0, 0.0
    metrics = {"extract/tokens": float(tokens), "extract/tokens_per_s": float(rate),
               "extract/bytes": float(nbytes), "extract/bytes_per_token": float(nbytes / tokens if tokens else 0.0),
               "extract/vocab_coverage": float(manifest["vocabs"][vocab_name(n, cfg.draft.vocab_size)]),
               "extract/samples": float(n), "extract/num_layers": float(len(manifest["layer_ids"]))}
    reporter.metrics(metrics)
    metrics["extract/layer_ids"] = ",".join(map(str, manifest["layer_ids"]))  # a string: log as a param/tag
    return metrics

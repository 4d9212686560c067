"""FeatureSource, the one way training reads target features (data/reader.py), on the tiny target's extracted
pools: the batches' contract, offline and online alike, zero padding, batch counts from lengths alone, and the
read-ahead workers (same batches in the same order, two at once through shard evictions)."""

import pytest
import torch
from safetensors.torch import load_file
from test_extract import config, make_samples, pool, run  # noqa: F401 (pool is a fixture)

from draftlab.data.features import read_manifest
from draftlab.data.reader import open_source


def test_batches_contract(pool):
    run(pool, config(pool, samples=20))
    source = open_source(config(pool, samples=20), {"extract": pool / "extract"})
    train_ids = {s.index for s in make_samples() if s.split == "train"}
    batches = list(source.batches("train", epoch=0, batch_tokens=64, max_seq_len=24, seed=1))
    seen = []
    for b in batches:
        B, T = b["input_ids"].shape
        assert B * T <= 64 or B == 1
        assert T <= 24 and b["features"].shape == (B, T, 192) and b["last_hidden"].shape == (B, T, 64)
        assert b["features"].dtype == torch.float32 and b["attention_mask"].dtype == torch.bool
        assert not b["loss_mask"][~b["attention_mask"]].any()
        assert bool(b["attention_mask"][:, 0].all())  # right padding
        seen += b["sample_index"].tolist()
    assert sorted(seen) == sorted(train_ids)
    again = [b["sample_index"].tolist() for b in source.batches("train", 0, 64, 24, seed=1)]
    other = [b["sample_index"].tolist() for b in source.batches("train", 1, 64, 24, seed=1)]
    assert again == [b["sample_index"].tolist() for b in batches] and other != again
    assert source.num_tokens("train") == sum(len(s.input_ids) for s in make_samples() if s.split == "train")
    d2t, t2d = source.vocab()
    assert len(d2t) == 64 and len(t2d) == 320
    assert set(source.head()) == {"embed_tokens.weight", "lm_head.weight"}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_online_and_offline_give_the_same_batches(pool, dtype):
    """Same tensors, same dtype: both come in the pool's extract.dtype (online rounds as offline stored)."""
    offline_cfg = config(pool, samples=12, batch_size=4, dtype=dtype)
    online_cfg = config(pool, samples=12, mode="online", dtype=dtype)
    run(pool, offline_cfg, folder="offline")
    metrics = run(pool, online_cfg, folder="online")
    assert not list((pool / "online").glob("shard-*")) and metrics["extract/bytes"] == 0
    assert read_manifest(pool / "online")["layer_ids"] == [1, 3, 4]
    assert (pool / "online" / "target_head.safetensors").exists()
    offline = open_source(offline_cfg, {"extract": pool / "offline"})
    online = open_source(online_cfg, {"extract": pool / "online", "generate": pool / "generate"})
    assert online.online and not offline.online
    for split in ("train", "val"):
        pairs = list(zip(offline.batches(split, 3, 80, 20, seed=7), online.batches(split, 3, 80, 20, seed=7)))
        assert pairs and len(pairs) == len(list(offline.batches(split, 3, 80, 20, seed=7)))
        for a, b in pairs:
            assert a.keys() == b.keys()
            for key in a:
                assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
                assert torch.allclose(a[key].float(), b[key].float(), atol=1e-5), key
    assert [torch.equal(x, y) for x, y in zip(offline.vocab(), online.vocab())] == [True, True]


def test_batches_pad_with_zeros_whatever_the_buffers_held(pool, monkeypatch):
    """The wide tensors are not zero-filled whole (reader.py): each row's padding must still come out zero."""
    cfg = config(pool, samples=12, batch_size=3, dtype="bfloat16")
    run(pool, cfg)
    source = open_source(cfg, {"extract": pool / "extract"})
    empty, filled = torch.empty, []

    def garbage(*shape, dtype=None, pin_memory=False):  # what an unzeroed buffer may hold
        filled.append(shape)
        return empty(*shape, dtype=dtype).fill_(7)

    monkeypatch.setattr(torch, "empty", garbage)
    padded = 0
    for batch in source.batches("train", 0, 64, 24, seed=1):
        assert batch["features"].dtype == batch["last_hidden"].dtype == torch.bfloat16
        pad = ~batch["attention_mask"]
        assert (batch["features"][pad] == 0).all() and (batch["last_hidden"][pad] == 0).all()
        assert (batch["features"][~pad] != 7).any()  # the real rows were read over the fill
        padded += int(pad.sum())
    assert padded > 0 and filled  # padding was there, and the reader took its buffers from torch.empty


def test_batch_count_comes_from_lengths_alone(pool, monkeypatch):
    """Training sizes its schedule from num_batches: it must match a real pass, without reading any shard."""
    run(pool, config(pool, samples=20))
    source = open_source(config(pool, samples=20), {"extract": pool / "extract"})
    for epoch, tokens in ((0, 64), (1, 200)):
        real = sum(1 for _ in source.batches("train", epoch, tokens, 24, seed=1))
        monkeypatch.setattr(source, "_offline_batch", lambda *a: pytest.fail("a shard was read"))
        assert source.num_batches("train", epoch, tokens, 24, seed=1) == real
        monkeypatch.undo()


def test_prefetched_batches_equal_batches_read_in_line(pool):
    """Offline batches are read ahead on a worker thread: same batches, same order; stopping early and a second
    iterator at the same time (validation in the middle of an epoch) are both fine."""
    run(pool, config(pool, samples=20))
    source = open_source(config(pool, samples=20), {"extract": pool / "extract"})
    in_line = [source._offline_batch(g, 24) for g in source._plan("train", 2, 64, 24, 1, True)]
    prefetched = source.batches("train", 2, 64, 24, seed=1)
    first = next(prefetched)
    val = list(source.batches("val", 0, 64, 24, seed=1, shuffle=False))  # while the train iterator is paused
    rest = list(prefetched)
    assert len(in_line) == 1 + len(rest) > 3 and val
    for a, b in zip(in_line, [first, *rest]):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    stopped = source.batches("train", 2, 64, 24, seed=1)
    assert torch.equal(next(stopped)["input_ids"], first["input_ids"])
    stopped.close()  # the worker is shut down, nothing hangs


def test_prepare_maps_each_batch_on_the_read_ahead_worker(pool):
    """The trainer lists its packed rows in `prepare`: it runs on the read-ahead workers, once per batch (two
    workers may call it in either order), and the mapped batches come back in the plan's order."""
    import threading

    run(pool, config(pool, samples=20))
    source = open_source(config(pool, samples=20), {"extract": pool / "extract"})
    threads, lock = [], threading.Lock()

    def prepare(batch):
        with lock:
            threads.append(threading.current_thread().name)
        return dict(batch, seen=tuple(batch["sample_index"].tolist()))

    plain = list(source.batches("train", 1, 64, 24, seed=1))
    mapped = list(source.batches("train", 1, 64, 24, seed=1, prepare=prepare))
    assert [b["seen"] for b in mapped] == [tuple(b["sample_index"].tolist()) for b in plain]
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(plain, mapped))
    assert len(threads) == len(plain) and all(name.startswith("draftlab-batches") for name in threads)


def test_two_workers_reading_at_once_through_evictions_read_the_stored_rows(pool, monkeypatch):
    """Two read-ahead workers build batches at the same time (a barrier holds each until the other is inside too),
    a validation iterator reads while training is paused, and one open shard at a time forces evictions under
    them: every row equals the rows stored in the shard files, read here without the reader."""
    import itertools
    import threading

    from draftlab.data import reader

    run(pool, config(pool, samples=20))
    monkeypatch.setattr(reader, "MAX_OPEN_SHARDS", 1)
    source = open_source(config(pool, samples=20), {"extract": pool / "extract"})
    manifest = read_manifest(pool / "extract")
    stored = {}  # sample index -> (features, last_hidden) from the files themselves
    for shard in manifest["shards"]:
        t = load_file(str(pool / "extract" / f"{shard['name']}.safetensors"))
        offsets = t["offsets"].tolist()
        for i, index in enumerate(t["sample_index"].tolist()):
            span = slice(offsets[i], offsets[i + 1])
            stored[index] = (t["features"][span], t["last_hidden"][span])
    both_inside = threading.Barrier(2, timeout=10)  # broken (the read fails) unless two workers overlap
    names, calls, lock = set(), itertools.count(), threading.Lock()

    def prepare(batch):  # runs on the worker that built the batch
        with lock:
            names.add(threading.current_thread().name)
            call = next(calls)
        if call < 2:  # the first two batches: each waits here until the other has been built too
            both_inside.wait()
        return batch

    train = source.batches("train", 0, 64, 24, seed=1, prepare=prepare)
    batches = [next(train)]
    batches += list(source.batches("val", 0, 64, 24, seed=1, shuffle=False))
    batches += list(train)
    assert len(names) >= 2 and len(source._handles) == 1
    rows = 0
    for batch in batches:
        for i, index in enumerate(batch["sample_index"].tolist()):
            n = int(batch["attention_mask"][i].sum())
            want_features, want_last = stored[index]
            assert torch.equal(batch["features"][i, :n], want_features[:n])
            assert torch.equal(batch["last_hidden"][i, :n], want_last[:n])
            assert not batch["features"][i, n:].any()
            rows += 1
    assert rows == source.num_samples_in("train") + source.num_samples_in("val")


def test_a_small_bound_on_open_shards_reads_the_same_batches(pool, monkeypatch):
    """A shard stays open (its handle and its small tensors read whole) up to MAX_OPEN_SHARDS of them; past that the
    oldest is closed and opened again when a batch needs it. The batches are the same either way."""
    from draftlab.data import reader

    cfg = config(pool, samples=20)  # five shards of four samples
    run(pool, cfg)
    kept = list(open_source(cfg, {"extract": pool / "extract"}).batches("train", 0, 64, 24, seed=1))
    opened = []

    class Counting(reader.OpenShard):
        def __init__(self, path):
            opened.append(path.name)
            super().__init__(path)

    monkeypatch.setattr(reader, "MAX_OPEN_SHARDS", 1)
    monkeypatch.setattr(reader, "OpenShard", Counting)
    source = open_source(cfg, {"extract": pool / "extract"})
    bounded = list(source.batches("train", 0, 64, 24, seed=1))
    assert len(source._handles) == 1 and len(opened) > len(set(opened)) == 5  # closed and opened again
    assert set(source._handles[next(iter(source._handles))].small) == {"input_ids", "loss_mask", "target_top"}
    assert len(kept) == len(bounded) > 3
    for a, b in zip(kept, bounded):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)

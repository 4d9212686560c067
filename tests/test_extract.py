"""The extract stage and FeatureSource on the tiny target: stored features equal a plain forward at the right
layers, resume extracts only what is missing, and offline and online sources give the same batches."""

import logging

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import draftlab.target
from draftlab.config import ConfigError, default_config
from draftlab.data.features import open_source, read_manifest
from draftlab.data.samples import Sample, write_samples
from draftlab.data.vocab import read_vocab, vocab_path
from draftlab.reporting import RecordingReporter
from draftlab.stages import extract

NUM_SAMPLES = 20


def make_samples(count=NUM_SAMPLES, seed=0):
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(count):
        prompt, answer = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((4, 16), (3, 28)))
        ids = torch.randint(3, 320, (prompt + answer,), generator=gen)
        mask = torch.zeros(prompt + answer, dtype=torch.bool)
        mask[prompt:] = True
        samples.append(Sample(i, ids, mask, "val" if i % 5 == 4 else "train"))
    return samples



@pytest.fixture
def pool(tmp_path):
    write_samples(tmp_path / "generate", make_samples(), shard_size=8)
    return tmp_path


def config(root, **extract_overrides):
    samples = extract_overrides.pop("samples", 10)
    vocab = extract_overrides.pop("vocab_size", 64)
    ext = {"dtype": "float32", "batch_size": 1, "shard_size": 4, **extract_overrides}
    return default_config({"target": {"name": "tiny"}, "paths": {"root": str(root)}, "data": {"samples": samples},
                           "extract": ext, "draft": {"vocab_size": vocab}})


def run(root, cfg, folder="extract"):
    return extract.run(cfg, root / folder, {"generate": root / "generate"}, RecordingReporter())


def stored_samples(folder):
    """(sample index -> (features, last_hidden, input_ids)) over all shards in the manifest."""
    found = {}
    for shard in read_manifest(folder)["shards"]:
        t = load_file(str(folder / f"{shard['name']}.safetensors"))
        offsets = t["offsets"].tolist()
        for i, index in enumerate(t["sample_index"].tolist()):
            span = slice(offsets[i], offsets[i + 1])
            found[index] = (t["features"][span], t["last_hidden"][span], t["input_ids"][span].long())
    return found


@pytest.fixture
def no_target(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("the target must not be loaded here")

    monkeypatch.setattr(draftlab.target, "load_target", refuse)


def test_features_equal_plain_forward_at_the_right_layers(pool):
    """Exact in fp32 (batch 1, same kernels); the neighbours k and k+2 must differ, so an off-by-one fails."""
    metrics = run(pool, config(pool))
    assert metrics["extract/layer_ids"] == "1,3,4"  # auto on 8 layers
    target = draftlab.target.tiny_target()
    H = target.hidden_size
    stored = stored_samples(pool / "extract")
    assert sorted(stored) == list(range(10))
    for features, last, ids in stored.values():
        with torch.no_grad():
            ref = target.model(ids[None], output_hidden_states=True)
        hs = [h[0] for h in ref.hidden_states]
        for slot, k in enumerate([1, 3, 4]):
            got = features[:, slot * H:(slot + 1) * H]
            assert torch.equal(got, hs[k + 1]), f"layer {k} is not HF hidden_states[{k + 1}]"
            assert not torch.allclose(got, hs[k], atol=1e-3) and not torch.allclose(got, hs[k + 2], atol=1e-3)
        assert torch.equal(last, hs[-1])  # the final normed state
        head = load_file(str(pool / "extract" / "target_head.safetensors"))
        assert torch.equal(F.linear(last, head["lm_head.weight"]), ref.logits[0])


def test_batched_extraction_matches_and_bf16_storage(pool):
    run(pool, config(pool, batch_size=3), folder="fp32")
    run(pool, config(pool, batch_size=3, dtype="bfloat16"), folder="bf16")
    target = draftlab.target.tiny_target()
    fp32, bf16 = stored_samples(pool / "fp32"), stored_samples(pool / "bf16")
    for index, (features, last, ids) in fp32.items():
        with torch.no_grad():
            ref = target.model.model(ids[None], output_hidden_states=True)
        assert torch.allclose(features[:, :64], ref.hidden_states[2][0], atol=1e-5)  # right padding is harmless
        assert torch.allclose(last, ref.last_hidden_state[0], atol=1e-5)
        assert bf16[index][0].dtype == torch.bfloat16
        assert torch.equal(bf16[index][0], features.to(torch.bfloat16))


def test_head_vocab_manifest_and_metrics(pool):
    metrics = run(pool, config(pool, dtype="float16"))
    folder = pool / "extract"
    manifest = read_manifest(folder)
    target = draftlab.target.tiny_target()
    assert manifest["layer_ids"] == [1, 3, 4] and manifest["sglang_servable"]
    assert manifest["convention"].startswith("sglang-llama")
    assert manifest["target"]["fingerprint"] == target.fingerprint
    assert manifest["target"]["config"]["num_hidden_layers"] == 8
    assert manifest["shapes"] == {"features": [-1, 192], "last_hidden": [-1, 64]}
    head = load_file(str(folder / "target_head.safetensors"))
    assert head["embed_tokens.weight"].dtype == torch.float32
    assert torch.equal(head["lm_head.weight"], target.model.lm_head.weight)
    tokens = sum(len(s.input_ids) for s in make_samples()[:10])
    assert metrics["extract/tokens"] == tokens and metrics["extract/samples"] == 10
    assert 2 * 256 <= metrics["extract/bytes_per_token"] < 2 * 256 + 64  # fp16 features + last_hidden + ids
    vocab = read_vocab(vocab_path(folder, 10, 64))
    train = [s for s in make_samples()[:10] if s.split == "train"]
    answer = torch.cat([s.input_ids[s.loss_mask] for s in train])
    assert vocab["counts"].sum() == len(answer)
    assert metrics["extract/vocab_coverage"] == pytest.approx(float(vocab["t2d"][answer].float().mean()))
    for key in ("tokens", "tokens_per_s", "bytes", "bytes_per_token", "vocab_coverage", "samples"):
        assert isinstance(metrics[f"extract/{key}"], float)


def test_resume_extracts_only_missing_samples(pool, monkeypatch):
    run(pool, config(pool, samples=6))  # shards: 0-3, 4-5
    folder = pool / "extract"
    first = (folder / "shard-00000.safetensors").read_bytes()
    (folder / "shard-00002.safetensors").write_bytes(b"partial write of a killed run")  # not in the manifest
    (folder / ".shard-00002.safetensors.x.tmp").write_bytes(b"junk")
    seen = []
    original = extract.extract_shard
    monkeypatch.setattr(extract, "extract_shard",
                        lambda tap, shard, *a: seen.extend(s.index for s in shard) or original(tap, shard, *a))
    run(pool, config(pool, samples=14))
    assert seen == list(range(6, 14))
    assert (folder / "shard-00000.safetensors").read_bytes() == first
    assert not list(folder.glob(".*.tmp"))
    manifest = read_manifest(folder)
    assert [s["first"] for s in manifest["shards"]] == [0, 4, 6, 10]
    assert sorted(stored_samples(folder)) == list(range(14))


def test_no_target_when_nothing_is_missing(pool, monkeypatch):
    run(pool, config(pool, samples=12))
    monkeypatch.setattr(draftlab.target, "load_target", lambda *a, **k: pytest.fail("target loaded"))
    metrics = run(pool, config(pool, samples=8, vocab_size=32))  # a smaller N and a new vocab: no target needed
    assert metrics["extract/samples"] == 8
    assert vocab_path(pool / "extract", 8, 32).exists()


@pytest.mark.parametrize("layers, fragment", [([1, 7], "last layer"), ([2, 9], "outside")])
def test_bad_layers_fail_before_the_target_loads(pool, no_target, layers, fragment):
    with pytest.raises(ConfigError, match=r"^extract\.layers: .*" + fragment):
        run(pool, config(pool, layers=layers))


def test_vocab_size_above_target_vocab(pool):
    with pytest.raises(ConfigError, match=r"^draft\.vocab_size"):
        run(pool, config(pool, vocab_size=321))


def test_last_layer_ablation_is_recorded(pool, caplog):
    with caplog.at_level(logging.WARNING):
        metrics = run(pool, config(pool, layers="last"))
    assert "SGLang" in caplog.text and metrics["extract/layer_ids"] == "7"
    manifest = read_manifest(pool / "extract")
    assert manifest["layers_spec"] == "last" and manifest["sglang_servable"] is False and manifest["warning"]
    target = draftlab.target.tiny_target()
    features, last, _ = stored_samples(pool / "extract")[0]
    # id 7 is the raw output of the last layer; its final norm is last_hidden (HF's hidden_states[8]).
    assert not torch.allclose(features, last, atol=1e-3)
    with torch.no_grad():
        assert torch.allclose(target.model.model.norm(features), last, atol=1e-6)


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
    """The wide tensors are not zero-filled whole (features.py): each row's padding must still come out zero."""
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


def test_a_pool_made_with_other_layers_starts_over(pool):
    """Under DVC the extract folder is fixed whatever the settings: other layers must replace, never mix."""
    run(pool, config(pool))
    run(pool, config(pool, layers=[1, 2, 3]))
    manifest = read_manifest(pool / "extract")
    assert manifest["layer_ids"] == [1, 2, 3] and manifest["num_samples"] == 10
    assert all(f.shape[1] == 3 * 64 for f, _, _ in stored_samples(pool / "extract").values())


def test_batch_count_comes_from_lengths_alone(pool, monkeypatch):
    """Training sizes its schedule from num_batches: it must match a real pass, without reading any shard."""
    run(pool, config(pool, samples=20))
    source = open_source(config(pool, samples=20), {"extract": pool / "extract"})
    for epoch, tokens in ((0, 64), (1, 200)):
        real = sum(1 for _ in source.batches("train", epoch, tokens, 24, seed=1))
        monkeypatch.setattr(source, "_offline_batch", lambda *a: pytest.fail("a shard was read"))
        assert source.num_batches("train", epoch, tokens, 24, seed=1) == real
        monkeypatch.undo()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stored_target_top_gives_the_plain_soft_targets(pool, dtype):
    """extract stores the full-vocab argmax (int32, 4 bytes a token) of the stored last_hidden; training's fast path
    (draft rows of lm_head only) then forms exactly the targets of the full-vocab path, batch by batch."""
    from draftlab.train.ttt import target_distribution

    cfg = config(pool, samples=12, batch_size=3, dtype=dtype)
    run(pool, cfg)
    assert read_manifest(pool / "extract")["target_top"] is True
    source = open_source(cfg, {"extract": pool / "extract"})
    d2t, t2d = source.vocab()
    lm_head = source.head()["lm_head.weight"]
    checked = 0
    for batch in source.batches("train", 0, 128, 64, seed=3):  # no truncation: every token checked
        assert batch["target_top"].dtype == torch.int32 and batch["target_top"].shape == batch["input_ids"].shape
        plain = target_distribution(batch["last_hidden"], lm_head, d2t, t2d)
        fast = target_distribution(batch["last_hidden"], lm_head, d2t, t2d, top=batch["target_top"])
        real = batch["attention_mask"]
        assert torch.equal(fast.top[real], plain.top[real]) and torch.equal(fast.in_vocab[real], plain.in_vocab[real])
        assert torch.allclose(fast.probs, plain.probs, atol=1e-6)
        checked += int(real.sum())
    assert checked == source.num_tokens("train")


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

    from draftlab.data import features

    run(pool, config(pool, samples=20))
    monkeypatch.setattr(features, "MAX_OPEN_SHARDS", 1)
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
    from draftlab.data import features

    cfg = config(pool, samples=20)  # five shards of four samples
    run(pool, cfg)
    kept = list(open_source(cfg, {"extract": pool / "extract"}).batches("train", 0, 64, 24, seed=1))
    opened = []

    class Counting(features.OpenShard):
        def __init__(self, path):
            opened.append(path.name)
            super().__init__(path)

    monkeypatch.setattr(features, "MAX_OPEN_SHARDS", 1)
    monkeypatch.setattr(features, "OpenShard", Counting)
    source = open_source(cfg, {"extract": pool / "extract"})
    bounded = list(source.batches("train", 0, 64, 24, seed=1))
    assert len(source._handles) == 1 and len(opened) > len(set(opened)) == 5  # closed and opened again
    assert set(source._handles[next(iter(source._handles))].small) == {"input_ids", "loss_mask", "target_top"}
    assert len(kept) == len(bounded) > 3
    for a, b in zip(kept, bounded):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)

"""The extract stage on the tiny target: stored features equal a plain forward at the right layers, resume extracts
only what is missing, bad layers fail before the target loads. How training reads the pools: test_feature_source.py."""

import logging

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import draftlab.target.target
from draftlab.config.config import ConfigError, default_config
from draftlab.data.features import read_manifest
from draftlab.data.reader import open_source
from draftlab.data.samples import Sample, write_samples
from draftlab.data.vocab import read_vocab, vocab_path
from draftlab.util.reporting import RecordingReporter
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

    monkeypatch.setattr(draftlab.target.target, "load_target", refuse)


def test_features_equal_plain_forward_at_the_right_layers(pool):
    """Exact in fp32 (batch 1, same kernels); the neighbours k and k+2 must differ, so an off-by-one fails."""
    metrics = run(pool, config(pool))
    assert metrics["extract/layer_ids"] == "1,3,4"  # auto on 8 layers
    target = draftlab.target.target.tiny_target()
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
    target = draftlab.target.target.tiny_target()
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
    target = draftlab.target.target.tiny_target()
    assert manifest["layer_ids"] == [1, 3, 4] and manifest["sglang_servable"]
    assert manifest["convention"].startswith("sglang: capture point c") and manifest["capture_points"] == [2, 4, 5]
    assert manifest["capture"].startswith("LlamaForCausalLM, SGLang ")
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
    monkeypatch.setattr(draftlab.target.target, "load_target", lambda *a, **k: pytest.fail("target loaded"))
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
    target = draftlab.target.target.tiny_target()
    features, last, _ = stored_samples(pool / "extract")[0]
    # id 7 is the raw output of the last layer; its final norm is last_hidden (HF's hidden_states[8]).
    assert not torch.allclose(features, last, atol=1e-3)
    with torch.no_grad():
        assert torch.allclose(target.model.model.norm(features), last, atol=1e-6)


def test_a_pool_made_with_other_layers_starts_over(pool):
    """Under DVC the extract folder is fixed whatever the settings: other layers must replace, never mix."""
    run(pool, config(pool))
    run(pool, config(pool, layers=[1, 2, 3]))
    manifest = read_manifest(pool / "extract")
    assert manifest["layer_ids"] == [1, 2, 3] and manifest["num_samples"] == 10
    assert all(f.shape[1] == 3 * 64 for f, _, _ in stored_samples(pool / "extract").values())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stored_target_top_gives_the_plain_soft_targets(pool, dtype):
    """extract stores the full-vocab argmax (int32, 4 bytes a token) of the stored last_hidden where training reads
    it (s where loss_mask[s+1]) and 0 elsewhere; training's fast path (draft rows of lm_head only) then forms
    exactly the targets of the full-vocab path there, batch by batch (tests/unit/test_ttt.py: the unroll reads nothing
    else)."""
    from draftlab.train.ttt import target_distribution

    cfg = config(pool, samples=12, batch_size=3, dtype=dtype)
    run(pool, cfg)
    assert read_manifest(pool / "extract")["target_top"] is True
    source = open_source(cfg, {"extract": pool / "extract"})
    d2t, t2d = source.vocab()
    lm_head = source.head()["lm_head.weight"]
    checked = read_count = 0
    for batch in source.batches("train", 0, 128, 64, seed=3):  # no truncation: every token checked
        assert batch["target_top"].dtype == torch.int32 and batch["target_top"].shape == batch["input_ids"].shape
        plain = target_distribution(batch["last_hidden"], lm_head, d2t, t2d)
        fast = target_distribution(batch["last_hidden"], lm_head, d2t, t2d, top=batch["target_top"])
        read = torch.zeros_like(batch["loss_mask"])
        read[:, :-1] = batch["loss_mask"][:, 1:]  # no sample is cut here: the next token is in the batch
        assert torch.equal(fast.top[read], plain.top[read]) and torch.equal(fast.in_vocab[read], plain.in_vocab[read])
        assert not batch["target_top"][~read].any()
        assert torch.allclose(fast.probs, plain.probs, atol=1e-6)
        checked += int(batch["attention_mask"].sum())
        read_count += int(read.sum())
    assert checked == source.num_tokens("train") and read_count > 0


def test_extraction_attention_never_goes_to_cudnn(pool, monkeypatch):
    """cuDNN's attention plans every new shape on the host; each extraction batch has its own padded length, and
    the stage ran 1.8x faster on the H200 with cuDNN's kernel switched off."""
    sdpa, cudnn_allowed = F.scaled_dot_product_attention, []

    def spy(*args, **kwargs):
        cudnn_allowed.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # PyTorch's default: the test can fail
    run(pool, config(pool, samples=6, batch_size=3))
    assert cudnn_allowed and not any(cudnn_allowed)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored after the stage

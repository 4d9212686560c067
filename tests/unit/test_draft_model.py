"""The EAGLE-3 draft module: config, names, SGLang graph semantics, attention rules, caches."""

from __future__ import annotations

import math

import pytest
import torch

from draftlab.model.draft import (DraftModelConfig, Eagle3Draft, KVCache, causal_attention, ttt_attention)

H, HT, V, VD = 32, 24, 64, 40




def small_config(layers: int = 1, **kw) -> DraftModelConfig:
    base = dict(hidden_size=H, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                target_hidden_size=HT, aux_layer_ids=[1, 4, 7], vocab_size=V, draft_vocab_size=VD,
                num_hidden_layers=layers, rope_theta=10000.0, max_position_embeddings=512)
    base.update(kw)
    return DraftModelConfig(**base)


def small_model(layers: int = 1, seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    model = Eagle3Draft(small_config(layers)).eval()
    with torch.no_grad():
        for p in model.parameters():  # break the ones-initialised norms so a swapped norm would show
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
        model.d2t.copy_(torch.arange(VD) * 0 + 3)
    return model


def test_hf_config_round_trip():
    cfg = small_config(layers=2)
    d = cfg.to_hf_config("bfloat16")
    assert d["architectures"] == ["LlamaForCausalLMEagle3"] and d["tie_word_embeddings"] is False
    assert d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 4, 7]
    assert d["torch_dtype"] == "bfloat16" and d["draft_vocab_size"] == VD and d["target_hidden_size"] == HT
    assert DraftModelConfig.from_hf_config(d) == cfg


def test_parameter_names_and_shapes():
    model = Eagle3Draft(small_config(layers=2))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = {"embed_tokens.weight": (V, H), "fc.weight": (H, 3 * HT), "norm.weight": (H,),
                "lm_head.weight": (VD, H), "d2t": (VD,), "t2d": (V,), "layers.0.input_layernorm.weight": (H,)}
    for i, width in ((0, 2 * H), (1, H)):
        p = f"layers.{i}."
        expected.update({p + "self_attn.q_proj.weight": (32, width), p + "self_attn.k_proj.weight": (16, width),
                         p + "self_attn.v_proj.weight": (16, width), p + "self_attn.o_proj.weight": (H, 32),
                         p + "mlp.gate_proj.weight": (48, H), p + "mlp.up_proj.weight": (48, H),
                         p + "mlp.down_proj.weight": (H, 48), p + "hidden_norm.weight": (H,),
                         p + "post_attention_layernorm.weight": (H,)})
    assert shapes == expected
    assert model.d2t.dtype == torch.long and model.t2d.dtype == torch.bool
    assert not model.embed_tokens.weight.requires_grad  # frozen copy of the target's


def _inputs(B=2, T=10, width=3 * HT, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    hidden = torch.randn(B, T, width, generator=g)
    pos = torch.arange(T).expand(B, T)
    return ids, hidden, pos


def test_outputs_follow_sglang_semantics():
    model = small_model()
    ids, feats, pos = _inputs()
    logits, nxt = model(ids, feats, pos)
    assert logits.shape == (2, 10, VD) and nxt.shape == (2, 10, H)
    # logits come from the normed sum; the next hidden is the pre-norm sum
    assert torch.allclose(logits, model.lm_head(model.norm(nxt)), atol=1e-6)
    # a hidden of width hidden_size skips fc (SGLang's width test) ...
    projected = model.fc(feats)
    assert torch.allclose(model(ids, projected, pos)[0], logits, atol=1e-5)
    # ... and the residual of layer 0 is the projected hidden: zero attention and MLP, next = fc(features)
    with torch.no_grad():
        model.layers[0].self_attn.o_proj.weight.zero_()
        model.layers[0].mlp.down_proj.weight.zero_()
    assert torch.allclose(model(ids, feats, pos)[1], projected, atol=1e-6)


def test_layer0_takes_the_embedding_first():
    model = small_model()
    ids, feats, pos = _inputs()
    other = (ids + 1) % V
    assert not torch.allclose(model(ids, feats, pos)[0], model(other, feats, pos)[0])
    with torch.no_grad():  # the first H input columns of q/k/v see the embedding: zero them, ids stop mattering
        for proj in ("q_proj", "k_proj", "v_proj"):
            getattr(model.layers[0].self_attn, proj).weight[:, :H] = 0
    assert torch.allclose(model(ids, feats, pos)[0], model(other, feats, pos)[0], atol=1e-6)


def _dense_rule(q, ks, vs, leaky=False):
    """Reference: explicit mask over [K_0 .. K_j] by the ARCHITECTURE.md rule (leaky: later steps causal too)."""
    B, Hq, T, D = q.shape
    rep = Hq // ks[0].shape[1]
    K = torch.cat([k.repeat_interleave(rep, 1) for k in ks], 2)
    Vv = torch.cat([v.repeat_interleave(rep, 1) for v in vs], 2)
    t = torch.arange(T)[:, None]
    kv = torch.arange(len(ks) * T)[None]
    step, p = kv // T, kv % T
    mask = torch.where(step == 0, p <= t, (p <= t) if leaky else (p == t))
    scores = (q @ K.transpose(-1, -2) / math.sqrt(D)).masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ Vv


def test_ttt_attention_matches_the_rule_with_gradients():
    g = torch.Generator().manual_seed(0)
    B, Hq, Hkv, T, D = 2, 4, 2, 9, 8
    q = torch.randn(B, Hq, T, D, generator=g, requires_grad=True)
    ks = [torch.randn(B, Hkv, T, D, generator=g, requires_grad=True) for _ in range(4)]
    vs = [torch.randn(B, Hkv, T, D, generator=g, requires_grad=True) for _ in range(4)]
    out = ttt_attention(q, ks[0], vs[0], ks[1:], vs[1:])
    ref = _dense_rule(q, ks, vs)
    assert torch.allclose(out, ref, atol=1e-5)
    assert not torch.allclose(out, _dense_rule(q, ks, vs, leaky=True), atol=1e-3)
    w = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad((out * w).sum(), [q, *ks, *vs])
    ref_grads = torch.autograd.grad((ref * w).sum(), [q, *ks, *vs])
    for a, b in zip(grads, ref_grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_kv_cache_chunks_equal_one_pass_and_crop_drops_entries():
    model = small_model(layers=2)
    ids, feats, pos = _inputs(T=12)
    full_logits, full_hidden = model(ids, feats, pos)
    cache = KVCache(2)
    outs = []
    for a, b in ((0, 5), (5, 6), (6, 12)):
        outs.append(model(ids[:, a:b], feats[:, a:b], pos[:, a:b], cache)[0])
    assert cache.length == 12
    assert torch.allclose(torch.cat(outs, 1), full_logits, atol=1e-5)
    cache.crop(6)  # drop 6.., redo them with other inputs and compare with the one-pass result
    assert cache.length == 6 and cache.keys[1].shape[2] == 6
    ids2 = ids.clone()
    ids2[:, 6:] = (ids2[:, 6:] + 5) % V
    again = model(ids2[:, 6:], feats[:, 6:], pos[:, 6:], cache)[0]
    assert torch.allclose(again, model(ids2, feats, pos)[0][:, 6:], atol=1e-5)


def test_causal_attention_prefix_alignment():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 3, 8, generator=g)
    k = torch.randn(1, 1, 7, 8, generator=g)
    v = torch.randn(1, 1, 7, 8, generator=g)
    out = causal_attention(q, k, v)  # 4 cached + 3 new: new token i sees keys 0..4+i
    for i in range(3):
        keys = k[:, :, : 5 + i].expand(1, 2, -1, -1)
        vals = v[:, :, : 5 + i].expand(1, 2, -1, -1)
        ref = ((q[:, :, i : i + 1] @ keys.transpose(-1, -2)) / math.sqrt(8)).softmax(-1) @ vals
        assert torch.allclose(out[:, :, i : i + 1], ref, atol=1e-6)


def test_draft_to_target_uses_offsets():
    model = small_model()
    with torch.no_grad():
        model.d2t.copy_(torch.arange(VD))  # draft id i -> target id 2i
    assert model.draft_to_target(torch.tensor([0, 3, 7])).tolist() == [0, 6, 14]


def test_ttt_attention_in_bfloat16_keeps_diagonal_scores_precise():
    """The CUDA path runs in bf16: the hi/lo split keeps the diagonal scores as precise as the fused ones."""
    g = torch.Generator().manual_seed(4)
    B, Hq, T, D = 1, 2, 16, 64
    q = torch.randn(B, Hq, T, D, generator=g) * 2
    ks = [torch.randn(B, 1, T, D, generator=g) * 2 for _ in range(3)]
    vs = [torch.randn(B, 1, T, D, generator=g) for _ in range(3)]
    ref = _dense_rule(q, ks, vs)
    bf = [x.to(torch.bfloat16) for x in (q, *ks, *vs)]
    out = ttt_attention(bf[0], bf[1], bf[4], bf[2:4], bf[5:7]).float()
    same_inputs = _dense_rule(*(x.float() for x in bf[:1]), [x.float() for x in bf[1:4]], [x.float() for x in bf[4:]])
    assert (out - same_inputs).abs().max() < 0.03  # bf16 output rounding only
    assert (out - ref).abs().max() < 0.1

"""The local speculative engine is lossless: greedy output == the target's own greedy output, token for token,
and with temperature > 0 the output distribution is the target's (chi-square against exact probabilities).

The drafters here are test doubles that know the target's greedy continuation and choose to be right, wrong
or randomly right, so every accept length 0..k occurs. Why the greedy test would catch an off-by-one: with a
wrong draft, keeping one KV entry too many leaves a rejected token in the target's context (or one too few
drops a real one), so the next verify conditions on a different prefix and the output changes; the mutation
test below breaks `_rollback_length` both ways and checks that the comparison fails.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from draftlab.serve import engine as eng
from draftlab.serve.engine import SpecEngine, target_decode, verify_sampling
from draftlab.target.target import tiny_target

K = 4
MAX_NEW = 20
PROMPTS = ["Hello there", "What is the capital of France?", "Write a poem about the sea", "abc", "1+1=",
           "Why is the sky blue?"]


class ScriptDrafter:
    """Knows the target's greedy continuation; proposes it (right), its successor token (wrong), or each
    token right with probability p_right. Records the features the engine hands over."""

    feature_layers = (1, 3, 4)

    def __init__(self, reference: list[int], mode: str, vocab: int, p_right: float = 0.5, seed: int = 0):
        self.reference, self.mode, self.vocab, self.p_right = reference, mode, vocab, p_right
        self.rng = random.Random(seed)
        self.features: list[torch.Tensor] = []
        self.pos = 0  # completion tokens committed so far

    def start(self, prompt_ids, first_token, features):
        self.pos, self.features = 1, [features]

    def propose(self, k, temperature, generator):
        out = []
        for i in range(k):
            right = self.reference[self.pos + i] if self.pos + i < len(self.reference) else 0
            ok = self.mode == "right" or (self.mode == "random" and self.rng.random() < self.p_right)
            out.append(right if ok else (right + 1) % self.vocab)
        return torch.tensor(out), None

    def commit(self, tokens, features):
        self.pos += len(tokens)
        self.features.append(features)



@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def references(target):
    """(prompt ids, greedy continuation from model.generate) per prompt; long enough for drafts past the end."""
    out = []
    for text in PROMPTS:
        ids = target.chat_ids(text)
        gen = target.model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW + K + 1, do_sample=False,
                                    eos_token_id=None, min_new_tokens=MAX_NEW + K + 1)
        out.append((ids, gen[0, len(ids):].tolist()))
    return out


def _hf_greedy(target, ids, max_new, eos):
    gen = target.model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos)
    return gen[0, len(ids):].tolist()


def test_target_decode_equals_generate(target, references):
    for ids, ref in references[:3]:
        got = target_decode(target.model, ids, MAX_NEW, eos_token_ids=[])
        assert got.tokens == ref[:MAX_NEW]


@pytest.mark.parametrize("mode", ["right", "wrong", "random"])
def test_greedy_is_lossless(target, references, mode):
    accepted = set()
    for n, (ids, ref) in enumerate(references):
        drafter = ScriptDrafter(ref, mode, target.vocab_size, seed=n)
        got = SpecEngine(target.model, drafter, K, eos_token_ids=[]).generate(ids, MAX_NEW)
        assert got.tokens == ref[:MAX_NEW], f"prompt {n}"
        assert got.stop == "length" and len(got.tokens) == MAX_NEW
        # SGLang's count: completion tokens / verify steps, bonus and prefill token included
        assert got.verify_steps == len(got.accepted) == len(got.committed)
        assert sum(got.committed) + 1 == MAX_NEW
        accepted.update(got.accepted)
    expected = {"right": {K}, "wrong": {0}}.get(mode)
    if expected is not None:
        assert accepted <= expected | {K}  # the last step may be truncated but its accept count is K
        assert expected <= accepted
    else:
        assert len(accepted) >= 3  # several accept lengths were exercised


def test_accept_counts_always_right(target, references):
    ids, ref = references[0]
    got = SpecEngine(target.model, ScriptDrafter(ref, "right", target.vocab_size), K, []).generate(ids, 21)
    # 1 prefill token + 4 cycles of K+1: tau = 21 / 4 as SGLang reports it
    assert got.verify_steps == 4 and got.accepted == [K] * 4 and got.tau == pytest.approx(21 / 4)
    got = SpecEngine(target.model, ScriptDrafter(ref, "wrong", target.vocab_size), K, []).generate(ids, 21)
    assert got.verify_steps == 20 and got.tau == pytest.approx(21 / 20)


@pytest.mark.parametrize("mode", ["right", "random"])
def test_length_limit_inside_a_drafted_block(target, references, mode):
    ids, ref = references[1]
    for max_new in range(1, 2 * K + 4):
        drafter = ScriptDrafter(ref, mode, target.vocab_size, seed=max_new)
        got = SpecEngine(target.model, drafter, K, []).generate(ids, max_new)
        assert got.tokens == ref[:max_new] and got.stop == "length"


@pytest.mark.parametrize("mode", ["right", "random", "wrong"])
def test_eos_inside_a_drafted_block(target, references, mode):
    # Declare a token the target really generates to be EOS: generation must stop right after its first
    # occurrence, as generate(eos_token_id=...) does (checked once below), wherever it falls in a block.
    for n, (ids, ref) in enumerate(references[:4]):
        for eos_at in (0, 2, 3, 6, 9):
            eos = ref[eos_at]
            want = ref[: ref.index(eos) + 1]
            drafter = ScriptDrafter(ref, mode, target.vocab_size, seed=eos_at)
            got = SpecEngine(target.model, drafter, K, eos_token_ids=[eos]).generate(ids, MAX_NEW)
            assert got.tokens == want and got.stop == "eos"


def test_eos_semantics_match_generate(target, references):
    ids, ref = references[0]
    eos = ref[3]
    assert _hf_greedy(target, ids, MAX_NEW, eos) == ref[: ref.index(eos) + 1]


def test_features_are_the_target_layers_at_the_accepted_positions(target, references):
    ids, ref = references[2]
    drafter = ScriptDrafter(ref, "random", target.vocab_size, seed=3)
    got = SpecEngine(target.model, drafter, K, []).generate(ids, MAX_NEW)
    seen = torch.cat(drafter.features)
    with torch.no_grad():
        hs = target.model(torch.tensor([ids + got.tokens]), output_hidden_states=True).hidden_states
    full = torch.cat([hs[k + 1][0] for k in ScriptDrafter.feature_layers], -1)
    # feature t pairs with token t+1: the drafter has seen positions 0..N-1 of the committed sequence
    assert len(ids) < seen.shape[0] < len(ids) + MAX_NEW
    torch.testing.assert_close(seen, full[: seen.shape[0]], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shift", [1, -1])
@pytest.mark.parametrize("mode", ["wrong", "random"])
def test_off_by_one_rollback_is_caught(target, references, monkeypatch, shift, mode):
    """The comparison above fails if the target's rollback keeps one KV entry too many or too few."""
    # (never past what the verify forward wrote: a cache cannot grow by cropping)
    monkeypatch.setattr(eng, "_rollback_length", lambda before, m: min(before + m + 1 + shift, before + K + 1))
    mismatched = 0
    for n, (ids, ref) in enumerate(references):
        drafter = ScriptDrafter(ref, mode, target.vocab_size, seed=n)
        got = SpecEngine(target.model, drafter, K, []).generate(ids, MAX_NEW)
        mismatched += got.tokens != ref[:MAX_NEW]
    assert mismatched >= 2, "an off-by-one rollback went unnoticed"


# --- the real EAGLE-3 drafter, loaded from an exported folder as SGLang would load it -----------------------


@pytest.fixture(scope="module")
def eagle3_folder(target, tmp_path_factory):
    from test_bench_stage import agreeing_draft  # the draft that copies the target's last-layer logits

    from draftlab.sglang.export import export_draft

    full_vocab = (torch.zeros(target.vocab_size, dtype=torch.long), torch.ones(target.vocab_size, dtype=torch.bool))
    draft, cfg = agreeing_draft(target, full_vocab)
    with torch.no_grad():  # give attention and MLP real work, so the KV bookkeeping matters
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            torch.nn.init.normal_(draft.layers[0].get_submodule(name).weight, std=0.02)
    return export_draft(draft, cfg, tmp_path_factory.mktemp("draft") / "draft", "float32")


def test_eagle3_drafter_is_lossless(target, references, eagle3_folder):
    from draftlab.serve.eagle3_drafter import Eagle3Drafter

    drafter, loaded = Eagle3Drafter.from_folder(eagle3_folder, target.model)
    assert loaded.problems() == [] and loaded.feature_layers == (1, 3, 7)
    accepted = []
    for ids, ref in references:
        got = SpecEngine(target.model, drafter, K, []).generate(ids, MAX_NEW)
        assert got.tokens == ref[:MAX_NEW]
        accepted += got.accepted
    assert max(accepted) == K and 0 in accepted  # the draft is right often, not always


@pytest.fixture(scope="module")
def sharp_folder(target, tmp_path_factory):
    """A random draft with large q/k/o weights: attention is peaked, so positions and cache contents matter
    (with the default 0.02 init attention is nearly uniform and position bugs hide)."""
    from test_bench_stage import agreeing_draft

    from draftlab.sglang.export import export_draft

    full_vocab = (torch.zeros(target.vocab_size, dtype=torch.long), torch.ones(target.vocab_size, dtype=torch.bool))
    draft, cfg = agreeing_draft(target, full_vocab)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in draft.layers[0].named_parameters():
            if name.endswith("proj.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return export_draft(draft, cfg, tmp_path_factory.mktemp("sharp") / "draft", "float32")


def test_eagle3_drafter_state_equals_a_full_forward(target, references, sharp_folder):
    """After several cycles the draft's KV cache and last logits are what one teacher-forced pass over the
    committed sequence gives: extend positions, rope positions and drafted-entry cropping all line up."""
    from draftlab.serve.eagle3_drafter import Eagle3Drafter

    drafter, loaded = Eagle3Drafter.from_folder(sharp_folder, target.model)
    ids, ref = references[1]
    got = SpecEngine(target.model, drafter, K, []).generate(ids, MAX_NEW)
    assert got.tokens == ref[:MAX_NEW]
    n = drafter.length
    assert drafter.cache.length == n and len(ids) < n < len(ids) + len(got.tokens)
    assert_drafter_state_is_a_full_forward(target, drafter, loaded, ids + got.tokens)


def assert_drafter_state_is_a_full_forward(target, drafter, loaded, tokens: list[int]) -> None:
    """The drafter's current logits equal one forward of the draft over its first drafter.length positions of
    `tokens`, fed the target's features: what was committed step by step is what training computes at once."""
    n = drafter.length
    seq = torch.tensor([tokens])
    with torch.no_grad():
        hs = target.model(seq, output_hidden_states=True).hidden_states
        features = torch.cat([hs[k + 1] for k in loaded.feature_layers], -1)
        logits, _ = loaded.model(seq[:, 1: n + 1], features[:, :n], torch.arange(n)[None])
    torch.testing.assert_close(drafter.logits, logits[0, -1], atol=1e-3, rtol=1e-4)


def test_eagle3_drafting_steps_match_the_training_unroll(target, references, sharp_folder):
    """Serving's draft steps (own hidden state, rope position t+j, drafted keys visible to later steps, then
    cropped) are the training-time-test unroll at the last position: same tokens, teacher-forced by them."""
    from draftlab.model.draft import TTTCache
    from draftlab.serve.eagle3_drafter import Eagle3Drafter

    drafter, loaded = Eagle3Drafter.from_folder(sharp_folder, target.model)
    ids, _ = references[2]
    got = SpecEngine(target.model, drafter, K, []).generate(ids, MAX_NEW)
    model, step_logits = drafter.model, [drafter.logits]

    def recording(*args):  # the drafter's own per-step logits, to compare numbers rather than argmaxes
        out = model(*args)
        step_logits.append(out[0][0, -1])
        return out

    drafter.model = recording
    drafts, _ = drafter.propose(K, 0.0, None)
    n = drafter.length
    seq = torch.tensor([ids + got.tokens])[:, : n + 1]  # x_0..x_n: what the drafter has extended over
    ext = torch.cat([seq, drafts[None]], 1)
    with torch.no_grad():
        hs = target.model(seq, output_hidden_states=True).hidden_states
        hidden = torch.cat([hs[k + 1] for k in loaded.feature_layers], -1)[:, :n]
        cache, unrolled = TTTCache(1), []
        for j in range(K):
            logits, hidden = loaded.model(ext[:, 1 + j: 1 + j + n], hidden, torch.arange(n)[None] + j, cache)
            unrolled.append(logits[0, -1])
    torch.testing.assert_close(torch.stack(step_logits), torch.stack(unrolled), atol=1e-3, rtol=1e-4)
    assert drafts.tolist() == [int(loaded.model.draft_to_target(lg.argmax())) for lg in unrolled]


# --- temperature > 0 -------------------------------------------------------------------------------------

V_SMALL = 3


@pytest.fixture(scope="module")
def small_model():
    """A 1-layer Llama with a 3-token vocabulary and peaked logits, so a 3-token horizon has 27 outcomes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=V_SMALL, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # random init logits are ~0: make the target distribution non-trivial
    return model


class BigramDrafter:
    """Samples drafts from a fixed random bigram table q(x | previous token): wrong often, right often."""

    feature_layers = ()

    def __init__(self, vocab: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.softmax(2.0 * torch.randn(vocab, vocab, generator=g), -1)
        self.last = 0

    def start(self, prompt_ids, first_token, features):
        self.last = first_token

    def propose(self, k, temperature, generator):
        tokens, qs, prev = [], [], self.last
        for _ in range(k):
            q = self.table[prev]
            prev = int(torch.multinomial(q, 1, generator=generator))
            tokens.append(prev)
            qs.append(q)
        return torch.tensor(tokens), torch.stack(qs)

    def commit(self, tokens, features):
        self.last = int(tokens[-1])


def _exact_joint(model, prompt, horizon, temperature):
    """P(first `horizon` tokens) under the target at this temperature, by enumerating all sequences."""
    seqs = torch.cartesian_prod(*[torch.arange(V_SMALL)] * horizon)
    ids = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.double() / temperature, -1)
    P = len(prompt)
    steps = [logp[:, P - 1 + i].gather(1, seqs[:, i: i + 1])[:, 0] for i in range(horizon)]
    return torch.stack(steps).sum(0).exp().numpy()


def _chi2_pvalue(counts, probs):
    probs = np.asarray(probs, dtype=np.float64)
    expected = probs / probs.sum() * counts.sum()
    keep = expected >= 5  # pool the rare cells so the chi-square approximation holds
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp).pvalue


def test_sampling_matches_target_distribution(small_model):
    # horizon 3 with num_steps 2 covers the prefill token, a whole verify cycle and the start of the next
    prompt, horizon, n, temperature = [1, 2, 0, 2], 3, 600, 0.7
    probs = _exact_joint(small_model, prompt, horizon, temperature)
    engine = SpecEngine(small_model, BigramDrafter(V_SMALL), num_steps=2, eos_token_ids=[])
    g = torch.Generator().manual_seed(1234)
    counts = np.zeros(V_SMALL ** horizon)
    accepted = []
    for _ in range(n):
        got = engine.generate(prompt, horizon, temperature=temperature, generator=g)
        a, b, c = got.tokens
        counts[(a * V_SMALL + b) * V_SMALL + c] += 1
        accepted += got.accepted
    assert {0, 1, 2} <= set(accepted)  # rejections, partial and full acceptance all happened
    assert _chi2_pvalue(counts, probs) > 1e-3


def _rule_samples(rule, p, q, n, seed=0):
    """The first committed token of one verify step, n times, with drafts sampled from q."""
    g = torch.Generator().manual_seed(seed)
    first = np.zeros(p.shape[1])
    for _ in range(n):
        drafts = torch.multinomial(q, 1, generator=g)[:, 0]
        m, tokens = rule(drafts, q, p, g)
        first[int(tokens[0])] += 1
    return first


def test_rejection_rule_marginal_and_mutation():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(2 * torch.randn(3, 6, generator=g), -1)
    q = torch.softmax(2 * torch.randn(2, 6, generator=g), -1)
    counts = _rule_samples(verify_sampling, p, q, 1500)
    assert _chi2_pvalue(counts, p[0].numpy()) > 1e-3

    counts = _rule_samples(_broken_rule, p, q, 1500)  # must be caught
    assert _chi2_pvalue(counts, p[0].numpy()) < 1e-6


def _broken_rule(drafts, q, p, generator):
    """The classic bug: after a rejection, resample from p instead of norm(max(0, p - q))."""
    k = drafts.shape[0]
    u = torch.rand(k, generator=generator)
    ok = u * q.gather(1, drafts[:, None])[:, 0] < p[:k].gather(1, drafts[:, None])[:, 0]
    m = int(torch.cumprod(ok.long(), 0).sum())
    bonus = torch.multinomial(p[m], 1, generator=generator)[0]
    return torch.tensor(m), torch.cat([drafts[:m], bonus.view(1), drafts.new_zeros(k - m)])

"""The bench stage on the tiny target: metrics, histogram artifacts, and the predicted-vs-deployed alarm.

A trained draft on a random target would be slow and fuzzy, so the healthy draft is built to agree with the
target where it can: its features include the target's last layer (id 7), `fc` copies that slice, the
decoder layer adds nothing (o_proj = down_proj = 0) and norm + head are the target's. Its logits at position
t are then the target's own logits for x_{t+1}, and it proposes "the last token again". The tiny random
target repeats tokens a lot, so this draft reaches tau ~1.8 (4 steps) — clearly above tau_fail — and every
bit of it flows through `fc` and `d2t`: zero the fc (or let SGLang drop it) and the hidden state is 0, the
logits tie and draft id 0 (the pad token, never generated) is proposed; drop d2t and draft ids are read as
target ids, all wrong. Those must fail loudly. (The last layer is captured by our engine; SGLang cannot
capture it on Llama targets, which does not matter for what is tested here.)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftlab.config.config import default_config
from draftlab.data.samples import Sample, write_samples
from draftlab.data.vocab import build_vocab
from draftlab.sglang.export import export_draft
from draftlab.model.draft import DraftModelConfig, Eagle3Draft
from draftlab.checks.preflight import check_bench_sets
from draftlab.util.reporting import RecordingReporter
from draftlab.serve.alarm import DraftAlarm
from draftlab.serve.engine import target_decode
from draftlab.stages import bench
from draftlab.target.target import tiny_target

TEXTS = ["Hello there", "What is the capital of France?", "Write a poem about the sea", "abc", "1+1=",
         "Why is the sky blue?", "Tell me a story", "How do I cook rice?"]
VAL = {1, 3, 4, 7}  # indices of the held-out samples
DRAFT_VOCAB = 48



@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def vocab(target) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d): pad token 0 (draft id 0), every token the target generates for TEXTS, then filler from the
    top of the vocabulary, ascending as data/vocab.py sorts it. Small ids are NOT in it as themselves, so
    reading draft ids as target ids (no d2t) really is wrong."""
    seen = {0}
    for text in TEXTS:
        seen |= set(target_decode(target.model, target.chat_ids(text), 40, target.eos_token_ids).tokens)
    filler = [t for t in range(target.vocab_size - 1, 0, -1) if t not in seen][: DRAFT_VOCAB - len(seen)]
    selected = torch.tensor(sorted(seen | set(filler)))
    t2d = torch.zeros(target.vocab_size, dtype=torch.bool)
    t2d[selected] = True
    return selected - torch.arange(DRAFT_VOCAB), t2d


def agreeing_draft(target, vocab) -> tuple[Eagle3Draft, DraftModelConfig]:
    """The draft described in the module docstring; vocab = (d2t, t2d)."""
    m, H = target.model, target.hidden_size
    d2t, t2d = vocab
    cfg = DraftModelConfig(hidden_size=H, intermediate_size=2 * H, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=H // 4, target_hidden_size=H, aux_layer_ids=[1, 3, target.num_layers - 1],
                           vocab_size=target.vocab_size, draft_vocab_size=len(d2t),
                           rms_norm_eps=m.config.rms_norm_eps)
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    with torch.no_grad():
        draft.init_from_target(m.get_input_embeddings().weight, m.lm_head.weight, d2t, t2d)
        draft.fc.weight.zero_()
        draft.fc.weight[:, 2 * H:] = torch.eye(H)  # the last-layer slice of the features, unchanged
        draft.layers[0].self_attn.o_proj.weight.zero_()
        draft.layers[0].mlp.down_proj.weight.zero_()
        draft.norm.weight.copy_(m.model.norm.weight)
    return draft, cfg


def write_draft_folder(target, vocab, folder: Path, breakage: str | None = None) -> Path:
    """Exports the agreeing draft, optionally broken the way real exports break."""
    draft, cfg = agreeing_draft(target, vocab)
    if breakage == "zero_fc":
        with torch.no_grad():
            draft.fc.weight.zero_()
    export_draft(draft, cfg, folder, "float32")
    tensors = load_file(str(folder / "model.safetensors"))
    if breakage == "drop_d2t":
        tensors.pop("d2t")
    elif breakage == "misnamed_fc":  # SGLang finds neither 'fc_in.weight' nor 'model.fc_in.weight': dropped
        tensors["fc_in.weight"] = tensors.pop("fc.weight")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def samples(target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("generate")
    items = []
    for i, text in enumerate(TEXTS):
        prompt = target.chat_ids(text)
        answer = [ord("x") + 3] * 4  # the bench only reads the prompt part
        items.append(Sample(i, torch.tensor(prompt + answer), torch.tensor([0] * len(prompt) + [1] * 4).bool(),
                            "val" if i in VAL else "train", prompt=text))
    write_samples(folder, items)
    return folder


@pytest.fixture
def make_train(target, vocab, tmp_path):
    """make_train(predicted=..., breakage=...) -> a train-stage folder: draft/ + metrics.json."""

    def make(predicted: float | None = 2.0, breakage: str | None = None) -> Path:
        return _train_folder(target, vocab, tmp_path / "train", predicted, breakage)

    return make


def _train_folder(target, vocab, root: Path, predicted, breakage) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    write_draft_folder(target, vocab, root / "draft", breakage)
    metrics = {"val/loss": 1.0} if predicted is None else {"val/predicted_tau": predicted}
    (root / "metrics.json").write_text(json.dumps(metrics))
    return root


def config(tmp_path, **bench_over):
    return default_config({"target": {"name": "tiny"}, "paths": {"root": str(tmp_path / "out")},
                           "serve": {"num_steps": 4},
                           "bench": {"prompts": 3, "max_new_tokens": 40, **bench_over}})


def test_healthy_draft_reports_tau_speed_and_histogram(target, samples, tmp_path, make_train):
    train = make_train(predicted=2.0)
    reporter, out = RecordingReporter(), tmp_path / "bench"
    metrics = bench.run(config(tmp_path), out, {"generate": samples, "train": train}, reporter)
    assert metrics["bench/tau"] > 1.3  # the agreeing draft really is accepted
    assert metrics["bench/prompts"] == 3 and metrics["bench/tokens"] <= 3 * 40
    assert metrics["bench/tau"] == pytest.approx(metrics["bench/tokens"] / metrics["bench/verify_steps"])
    assert metrics["bench/accept_length"] == pytest.approx(1 + metrics["bench/mean_accepted"])
    assert metrics["bench/greedy_match_frac"] == 1.0  # fp32: lossless against the plain decode
    assert metrics["bench/tau_ratio"] == pytest.approx(metrics["bench/tau"] / 2.0)
    assert metrics["bench/speedup"] == pytest.approx(
        metrics["bench/tokens_per_s"] / metrics["bench/baseline_tokens_per_s"])
    rates = [metrics[f"bench/accept_rate_{j}"] for j in range(4)]
    assert rates == sorted(rates, reverse=True) and rates[0] > 0
    hist = json.loads((out / "accept_hist.json").read_text())
    assert hist["accept_length"] == [1, 2, 3, 4, 5] and sum(hist["count"]) == metrics["bench/verify_steps"]
    assert (out / "accept_hist.png").stat().st_size > 0
    assert {p.name for p, _ in reporter.artifacts} == {
        "accept_hist.json", "accept_hist.png", "per_prompt.json", "accept_by_position.png", "tau_by_set.png",
        "speedup_by_batch.png"}
    assert reporter.last("bench/tau") == metrics["bench/tau"]
    assert json.loads((out / "manifest.json").read_text())["complete"]
    assert "bench.alarm" not in reporter.tags
    # every set: tau with its interval, acceptance by position, speed-up; the first set's are the bench/* ones
    for name in ("sharegpt_val", "humaneval"):
        p = f"bench/{name}"
        assert metrics[f"{p}/prompts"] == 3
        assert metrics[f"{p}/tau_lo"] <= metrics[f"{p}/tau"] <= metrics[f"{p}/tau_hi"]
        for j in range(4):
            assert metrics[f"{p}/accept_rate_{j}_lo"] <= metrics[f"{p}/accept_rate_{j}"] <= \
                metrics[f"{p}/accept_rate_{j}_hi"]
        assert metrics[f"{p}/speedup"] == pytest.approx(metrics[f"{p}/tokens_per_s"] /
                                                        metrics[f"{p}/baseline_tokens_per_s"])
        assert metrics[f"{p}/tau_decidable"] == 0.0  # 3 prompts decide nothing
        assert metrics[f"{p}/greedy_match_frac"] == 1.0
        # the same prompts and positions counted both ways: deployment's count over the teacher-forced chains is
        # the engine's tau in fp32; training's count is another number
        assert metrics[f"{p}/walk_tau"] == pytest.approx(metrics[f"{p}/tau"])
        assert metrics[f"{p}/tf_tau"] != pytest.approx(metrics[f"{p}/tau"])
    assert metrics["bench/sharegpt_val/tau"] == metrics["bench/tau"]
    assert metrics["bench/humaneval/tau"] != metrics["bench/tau"]  # another set, other prompts
    assert metrics["bench/bs1/speedup"] == metrics["bench/speedup"]
    assert metrics["bench/bs4/greedy_match_frac"] == 1.0 and metrics["bench/bs4/rows"] == 4
    assert metrics["bench/bs4/speedup"] == pytest.approx(
        metrics["bench/bs4/tokens_per_s"] / metrics["bench/bs4/baseline_tokens_per_s"])
    table = json.loads((out / "per_prompt.json").read_text())
    assert table["sets"] == ["sharegpt_val", "humaneval"] and len(table["rows"]) == 6
    assert sum(r["verify_steps"] for r in table["rows"][:3]) == metrics["bench/verify_steps"]
    assert [r["walk_steps"] for r in table["rows"]] == [r["verify_steps"] for r in table["rows"]]
    # the bound the measured step costs allow (serve/step_costs.py), beside the speed-up reached
    costs = {n: metrics[f"bench/{n}"] for n in ("target_step_ms", "verify_step_ms", "draft_step_ms")}
    assert all(v > 0 for v in costs.values())
    assert metrics["bench/speedup_bound"] == pytest.approx(
        metrics["bench/tau"] / (1 + 4 * costs["draft_step_ms"] / costs["target_step_ms"]))
    assert metrics["bench/speedup_of_bound"] == pytest.approx(metrics["bench/speedup"] / metrics["bench/speedup_bound"])
    assert metrics["bench/speedup_bound_with_verify"] == pytest.approx(
        metrics["bench/tau"] * costs["target_step_ms"] / (costs["verify_step_ms"] + 4 * costs["draft_step_ms"]))
    assert metrics["bench/sync_free"] == 0.0  # no CUDA graphs: cycle by cycle


def test_user_file_set_and_a_bad_one(target, samples, tmp_path, make_train):
    prompts = tmp_path / "my prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": t}) for t in ("Count to ten", "Name a colour")) + "\n")
    metrics = bench.run(config(tmp_path, prompts=2, sets=[str(prompts)], batch_sizes=[1]), tmp_path / "bench",
                        {"generate": samples, "train": make_train()}, RecordingReporter())
    assert metrics["bench/my_prompts/prompts"] == 2 and metrics["bench/tau"] == metrics["bench/my_prompts/tau"]
    assert not any(k.startswith("bench/bs4/") for k in metrics)
    prompts.write_text('{"prompt": "fine"}\nnot json\n')
    with pytest.raises(ValueError, match="my prompts.jsonl:2"):
        bench.run(config(tmp_path, sets=[str(prompts)]), tmp_path / "bench2",
                  {"generate": samples, "train": make_train()}, RecordingReporter())
    missing = config(tmp_path, sets=[str(tmp_path / "missing.jsonl")])
    with pytest.raises(ValueError, match="bench.sets"):  # preflight refuses it before any stage runs
        check_bench_sets(missing)
    with pytest.raises(ValueError, match="bench.sets"):  # and the stage before any model loads (DVC's path)
        bench.run(missing, tmp_path / "bench3", {"generate": samples, "train": make_train()}, RecordingReporter())
    with pytest.raises(ValueError, match="bench.batch_sizes"):
        config(tmp_path, batch_sizes=[0])


def test_held_out_prompts_are_the_val_split(target, samples):
    prompts = bench.held_out_prompts(samples, 3)
    assert prompts == [target.chat_ids(TEXTS[i]) for i in sorted(VAL)[:3]]


@pytest.mark.parametrize("breakage,clue", [("zero_fc", "check-draft"), ("drop_d2t", "no d2t"),
                                           ("misnamed_fc", "dropped silently: fc_in.weight")])
def test_broken_draft_fails_loudly(target, samples, tmp_path, make_train, breakage, clue):
    train = make_train(predicted=2.0, breakage=breakage)
    reporter, out = RecordingReporter(), tmp_path / "bench"
    with pytest.raises(DraftAlarm) as err:
        bench.run(config(tmp_path, prompts=2), out, {"generate": samples, "train": train}, reporter)
    message = str(err.value)
    assert "contributes nothing" in message and clue in message
    for check in ("check-draft", "layers", "d2t", "EAGLE3"):
        assert check in message
    assert err.value.details["bench/tau"] <= 1.05
    assert not (out / "manifest.json").exists() and (out / "alarm.json").exists()
    assert reporter.tags["bench.alarm"] == "fail" and not reporter.series("bench/tau")


def test_broken_draft_fails_on_short_outputs_too(target, samples, tmp_path, make_train):
    # SGLang's tau counts the prefill token: 8 tokens in 7 fruitless steps read 1.14 > tau_fail. The local
    # accept length (prefill token excluded) is exactly 1.0 and trips the alarm anyway.
    train = make_train(breakage="zero_fc")
    with pytest.raises(DraftAlarm) as err:
        bench.run(config(tmp_path, prompts=1, max_new_tokens=8), tmp_path / "bench",
                  {"generate": samples, "train": train}, RecordingReporter())
    assert err.value.details["bench/tau"] > 1.05 and err.value.details["accept_length"] == 1.0


def test_low_ratio_warns_with_causes(target, samples, tmp_path, make_train, caplog):
    train = make_train(predicted=20.0)
    reporter = RecordingReporter()
    with caplog.at_level(logging.WARNING, logger="draftlab"):
        metrics = bench.run(config(tmp_path, prompts=1), tmp_path / "bench",
                            {"generate": samples, "train": train}, reporter)
    assert metrics["bench/tau_ratio"] < 0.6 and metrics["bench/predicted_tau"] == 20.0
    assert reporter.tags["bench.alarm"] == "warn"
    text = caplog.text
    for cause in ("teacher forcing", "prompts differ", "temperature", "vocabulary coverage", "TTT steps"):
        assert cause in text


def test_missing_prediction_still_reports(target, samples, tmp_path, make_train):
    train = make_train(predicted=None)
    metrics = bench.run(config(tmp_path, prompts=1), tmp_path / "bench", {"generate": samples, "train": train},
                        RecordingReporter())
    assert "bench/tau_ratio" not in metrics and metrics["bench/tau"] > 1.05


def test_sampling_bench_runs(target, samples, tmp_path, make_train):
    train = make_train()
    metrics = bench.run(config(tmp_path, prompts=1, temperature=0.8), tmp_path / "bench",
                        {"generate": samples, "train": train}, RecordingReporter())
    assert metrics["bench/tau"] >= 1.0 and "bench/greedy_match_frac" not in metrics


def fake_sglang(calls, tau_tokens=8):
    """run_sglang_bench's stand-in: every prompt answered with 8 tokens in 8 / tau_tokens * 8 verify steps."""
    from draftlab.stats.intervals import set_metrics

    def fake(serve, bench, target_path, draft_dir, sets, out, reporter):
        calls.append((target_path, Path(draft_dir), sets))
        metrics, rows = {}, []
        for name, prompts in sets.items():
            set_rows = [{"set": name, "prompt": i, "tokens": tau_tokens, "verify_steps": 8, "spec_s": 1.0,
                         "baseline_tokens": 8, "base_s": 1.0} for i in range(len(prompts))]
            metrics.update(set_metrics(f"bench/sglang/{name}", set_rows, 4, 0))
            rows += set_rows
        metrics.update({"bench/sglang/bs1/speedup": 1.0, "bench/sglang/bs4/speedup": 0.9})
        return metrics, rows

    return fake


def test_sglang_backend_delegates_then_alarms(target, samples, tmp_path, make_train, monkeypatch):
    import draftlab.sglang.bench as sglang_bench

    calls = []
    monkeypatch.setattr(sglang_bench, "run_sglang_bench", fake_sglang(calls))
    monkeypatch.setattr("draftlab.target.target.load_tokenizer", lambda *a: target.tokenizer)
    train = make_train(breakage="misnamed_fc")
    cfg = default_config({"target": {"name": "hf", "path": "/models/some-target"},
                          "paths": {"root": str(tmp_path / "out")},
                          "serve": {"backend": "sglang"}, "bench": {"prompts": 2}})
    with pytest.raises(DraftAlarm, match="dropped silently"):
        bench.run(cfg, tmp_path / "bench", {"generate": samples, "train": train}, RecordingReporter())
    assert calls and calls[0][0] == "/models/some-target" and calls[0][1] == train / "draft"
    assert list(calls[0][2]) == ["sharegpt_val", "humaneval"]
    assert calls[0][2]["sharegpt_val"] == [target.chat_ids(TEXTS[i]) for i in sorted(VAL)[:2]]
    assert len(calls[0][2]["humaneval"]) == 2


def test_both_backends_side_by_side_sglang_deployed(target, samples, tmp_path, make_train, monkeypatch):
    import draftlab.sglang.bench as sglang_bench
    from draftlab.tracking.summary import bench_rows

    calls = []
    monkeypatch.setattr(sglang_bench, "run_sglang_bench", fake_sglang(calls, tau_tokens=16))  # tau 2 in SGLang
    monkeypatch.setattr("draftlab.target.target.load_tokenizer", lambda *a: target.tokenizer)
    monkeypatch.setattr("draftlab.target.target.load_target", lambda *a, **k: target)
    monkeypatch.setattr("draftlab.target.target.serving_path", lambda *a: "/models/some-target")
    cfg = default_config({"target": {"name": "tiny"}, "paths": {"root": str(tmp_path / "out")},
                          "serve": {"backend": "both", "num_steps": 4},
                          "bench": {"prompts": 3, "max_new_tokens": 40, "batch_sizes": [1, 4]}})
    metrics = bench.run(cfg, tmp_path / "bench", {"generate": samples, "train": make_train(predicted=1.5)},
                        RecordingReporter())
    local = metrics["bench/sharegpt_val/tau"]
    assert metrics["bench/tau"] == metrics["bench/sglang/sharegpt_val/tau"] == pytest.approx(16 / 8)
    assert local != pytest.approx(2.0)  # the local engine measured for real, beside SGLang's numbers
    gap = "bench/sglang/sharegpt_val/tau_gap"
    assert metrics[gap] == pytest.approx(2.0 - local)
    assert metrics[f"{gap}_lo"] <= metrics[gap] <= metrics[f"{gap}_hi"]
    assert metrics["bench/bs4/speedup"] == 0.9 and "bench/bs4/tau" not in metrics  # bs4 is SGLang's alone
    rows = json.loads((tmp_path / "bench" / "per_prompt.json").read_text())["rows"]
    assert {r["engine"] for r in rows} == {"local", "sglang"}
    labels = dict(bench_rows(metrics))
    assert "bench sharegpt_val (local engine)" in labels and "bench sharegpt_val (SGLang)" in labels
    assert "minus the local engine's tau" in labels["bench sharegpt_val (SGLang)"]


def test_alarm_tells_a_weak_draft_from_a_broken_one():
    from types import SimpleNamespace

    from draftlab.serve.alarm import DraftAlarm, check

    cfg = SimpleNamespace(tau_fail=1.05, tau_ratio_warn=0.6)
    check(1.02, 1.08, cfg)  # training predicted almost nothing too: weak, reported with a warning
    with pytest.raises(DraftAlarm, match="contributes nothing"):
        check(1.02, 1.8, cfg)  # training predicted 1.8: a serving failure
    with pytest.raises(DraftAlarm, match="d2t"):
        check(1.02, 1.08, cfg, draft_problems=["d2t missing"])  # weak or not, a broken load is loud


def test_ratio_alarm_reads_the_interval_not_the_point():
    from types import SimpleNamespace

    from draftlab.serve.alarm import check

    cfg = SimpleNamespace(tau_fail=1.05, tau_ratio_warn=0.6)
    # point 1.5 / 3.0 = 50% but the interval reaches 2.0 (67%): the sample cannot tell, no warning
    result = check(1.5, 3.0, cfg, tau_hi=2.0)
    assert not result.warnings and result.metrics["bench/tau_ratio"] == 0.5
    assert result.metrics["bench/tau_ratio_hi"] == pytest.approx(2 / 3)
    # even the interval's upper end is below 60% of the prediction: warned
    assert "up to 1.70" in check(1.5, 3.0, cfg, tau_hi=1.7).warnings[0]
    assert check(1.5, 3.0, cfg).warnings  # no interval: the point value decides


def test_speedup_bounds_from_known_step_costs():
    """The H200 bench's step costs: 4.12 ms a target step, 4.394 ms a verify, 0.2054 ms a draft step, tau 3.081."""
    from draftlab.serve.step_costs import bound, bound_with_verify

    costs = {"target_step_ms": 4.12, "verify_step_ms": 4.394, "draft_step_ms": 0.2054}
    assert bound(3.081, 4, costs) == pytest.approx(2.569, abs=1e-3)
    assert bound_with_verify(3.081, 4, costs) == pytest.approx(2.434, abs=1e-3)
    assert bound(3.081, 4, {}) != bound(3.081, 4, {})  # nan without costs

"""`python -m draftlab plan` on the config.json files of real targets (tests/data: Kimi-K2.5, Llama-3.1-8B-Instruct,
Qwen3-30B-A3B; no weights), and its storage estimate against a real run of the tiny recipe."""

import json
import logging
from pathlib import Path

import pytest
import torch

from draftlab.plan import plan as plan_mod
from draftlab.__main__ import main as dispatch
from draftlab.config.config import ConfigError, validate
from draftlab.data import room
from draftlab.model.draft import DraftModelConfig, Eagle3Draft
from draftlab.plan.plan_estimates import draft_params, draft_shape
from draftlab.stages.train import draft_config
from conftest import compose_config, tiny_overrides

DATA = Path(__file__).resolve().parents[1] / "data"
KIMI, LLAMA, QWEN = DATA / "kimi-k2.5", DATA / "llama-3.1-8b", DATA / "qwen3-30b-a3b"
SGLANG_FLAGS = ("--speculative-algorithm EAGLE3", "--speculative-eagle-topk 1", "--speculative-num-steps 4",
                "--speculative-num-draft-tokens 5")


def overrides(tmp_path, folder, *extra):
    # paths.root that does not exist: no stage pool is planned, the room is tmp_path's filesystem
    return ["target=hf", f"target.path={folder}", f"paths.root={tmp_path / 'root'}", *extra]


def make(tmp_path, folder, *extra, **kwargs):
    return plan_mod.build(validate(compose_config(overrides(tmp_path, folder, *extra))), **kwargs)


def test_kimi_k25_plan_prints_capture_storage_draft_memory_and_flags(tmp_path, capsys):
    args = overrides(tmp_path, KIMI, "data.samples=10000", "data.max_new_tokens=2048")
    assert dispatch(["plan", *args, "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "ids [1, 29, 57] -> capture points [2, 30, 58]" in out  # DeepSeek-V3's +1 when the first id is 1
    assert "via DeepseekV3ForCausalLM" in out and "SGLang 0.5.23" in out
    assert "3 x 7,168 = 21,504 wide" in out
    assert "stored per token: 57,353 bytes" in out  # (21,504 + 7,168) x 2 bytes + 9 bytes of ids
    assert "feature storage: 0.9" in out and "TB for 10,000 samples of about 2,1" in out
    assert "pool as extract stores it (+ last hidden state and ids): 1.2" in out
    assert "draft: 2,143,318,016 parameters (968,912,896 trained" in out
    assert "ddp on 8 GPUs" in out
    for flag in SGLANG_FLAGS:
        assert flag in out

    plan = make(tmp_path, KIMI, "data.samples=10000", "data.max_new_tokens=2048")
    assert plan.storage.feature_width == 21504 and plan.storage.bytes_per_token == (21504 + 7168) * 2 + 9
    assert 2000 < plan.storage.tokens_per_sample < 2200
    assert 0.85e12 < plan.storage.feature_bytes < 0.95e12  # "roughly 0.9 TB in bf16"
    assert 1.1e12 < plan.storage.pool_bytes < 1.3e12


def test_llama_auto_ids_and_qwen3_moe_layers(tmp_path):
    llama = make(tmp_path, LLAMA)
    assert llama.text["num_hidden_layers"] == 32
    assert llama.ids == [1, 15, 28] and llama.points == [2, 16, 29]
    assert llama.storage.feature_width == 3 * 4096
    qwen = make(tmp_path, QWEN)
    assert qwen.text["num_hidden_layers"] == 48
    assert qwen.ids == [1, 23, 44] and qwen.points == [2, 24, 45]
    assert qwen.storage.feature_width == 3 * 2048
    assert qwen.params.total == draft_params(draft_shape(qwen.text, validate(compose_config()).draft, [1, 23, 44],
                                                         8192, 2048)).total
    explicit = make(tmp_path, LLAMA, "extract.layers=[2,10,20]")
    assert explicit.ids == [2, 10, 20] and explicit.points == [3, 11, 21]


def test_the_plan_reads_the_contract_of_the_serving_release(tmp_path, capsys):
    assert "SGLang 0.5.17" in make(tmp_path, LLAMA, "serve.sglang_version=0.5.17").describe
    assert "SGLang 0.5.23" in make(tmp_path, LLAMA, "serve.sglang_version=0.5.23").describe
    assert dispatch(["plan", *overrides(tmp_path, LLAMA, "serve.sglang_version=0.5.9")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "serve.sglang_version=0.5.9; shipped: 0.5.17, 0.5.23" in err[0]


@pytest.mark.parametrize("folder,extra", [(KIMI, ()), (LLAMA, ()), (QWEN, ()),
                                          (LLAMA, ("draft.hidden_size=1024", "draft.num_heads=8",
                                                   "draft.num_kv_heads=2", "draft.intermediate_size=2816",
                                                   "draft.num_layers=2"))])
def test_draft_parameters_match_the_built_draft(tmp_path, folder, extra):
    """The plan's shape is what the train stage builds, and its count is the model's own."""
    cfg = validate(compose_config(overrides(tmp_path, folder, *extra)))
    plan = plan_mod.build(cfg)
    shape = draft_shape(plan.text, cfg.draft, plan.ids, cfg.draft.vocab_size, cfg.train.max_seq_len)
    manifest = {"target": {"config": plan.text, "hidden_size": plan.text["hidden_size"]}, "layer_ids": plan.ids}
    assert draft_config(cfg.draft, manifest, cfg.draft.vocab_size, cfg.train.max_seq_len).to_dict() == shape
    with torch.device("meta"):
        model = Eagle3Draft(DraftModelConfig(**shape))
    if not plan.params.embedding_frozen:  # init_from_target trains the embedding when the widths differ
        model.embed_tokens.weight.requires_grad_(True)
    assert plan.params.total == sum(p.numel() for p in model.parameters())
    assert plan.params.trained == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert plan.params.embedding_frozen == (not extra)


def test_unknown_architecture_refused_naming_the_override(tmp_path, capsys):
    folder = tmp_path / "unknown"
    folder.mkdir()
    config = json.loads((LLAMA / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["FrobnicatorForCausalLM"]}))
    with pytest.raises(ConfigError, match="target.allow_unlisted_arch=true"):
        make(tmp_path, folder)
    assert dispatch(["plan", *overrides(tmp_path, folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FrobnicatorForCausalLM" in err[0] and "target.allow_unlisted_arch" in err[0]
    accepted = make(tmp_path, folder, "target.allow_unlisted_arch=true")
    assert accepted.ids == [1, 15, 28] and "not in the contract" in accepted.describe


def test_online_recommended_when_the_pool_does_not_fit(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(room, "free_bytes", lambda path: (200 * 10**9, False))
    args = ("data.samples=10000", "data.max_new_tokens=2048")
    plan = make(tmp_path, KIMI, *args)
    assert not plan.fits
    assert any("DOES NOT FIT: use extract.mode=online" in line for line in plan.lines())
    cfg = validate(compose_config(overrides(tmp_path, KIMI, *args)))
    with pytest.raises(ConfigError, match=r"^paths.root: .*set extract.mode=online"):
        plan_mod.check_fits(cfg)
    assert dispatch(["plan", *overrides(tmp_path, KIMI, *args)]) == 0
    assert "recommended: extract.mode=online" in capsys.readouterr().out

    online = validate(compose_config(overrides(tmp_path, KIMI, *args, "extract.mode=online")))
    plan_mod.check_fits(online)  # nothing stored: nothing to fit
    small = validate(compose_config(overrides(tmp_path, KIMI, "data.samples=100")))
    plan_mod.check_fits(small)


def test_job_refused_before_any_stage_when_the_pool_cannot_fit(tmp_path, monkeypatch):
    from draftlab.task import run_task

    monkeypatch.setattr(room, "free_bytes", lambda path: (1000, False))
    with pytest.raises(ConfigError, match="^paths.root: extract.mode=offline with data.samples=32"):
        run_task(compose_config(tiny_overrides(tmp_path, "tracking.enabled=false")))
    assert not (tmp_path / "out" / "generate").exists()


def test_storage_estimate_within_10_percent_of_a_tiny_run(tmp_path, caplog):
    """Before the run (prompt lengths from the tokenizer, answers at data.max_new_tokens) and after it (the generated
    lengths), the estimate is the extract pool's bytes_per_token x tokens within 10%."""
    from draftlab.plan.stage_keys import plan as stage_plan
    from draftlab.task import run_task

    cfg = compose_config(tiny_overrides(tmp_path, "tracking.enabled=false", "stages=[generate,extract]"))
    before = plan_mod.build(validate(cfg))
    with caplog.at_level(logging.INFO, logger="draftlab.plan"):
        run_task(cfg)
    assert any(r.getMessage().startswith("plan: capture: ids ") for r in caplog.records)  # logged at job start
    manifest = json.loads((stage_plan(validate(cfg))["extract"].folder / "manifest.json").read_text())
    assert manifest["num_samples"] == before.storage.samples
    measured = manifest["bytes_per_token"] * manifest["tokens"]
    after = plan_mod.build(validate(cfg))
    assert "measured over the 32 generated samples" in after.tokens_how
    assert abs(before.storage.pool_bytes / measured - 1) < 0.10, (before.storage.pool_bytes, measured)
    assert abs(after.storage.pool_bytes / measured - 1) < 0.10, (after.storage.pool_bytes, measured)
    assert after.storage.bytes_per_token == (3 * 64 + 64) * 4 + 9  # float32 in the smoke recipe


@pytest.mark.parametrize("args,key", [(["target=hf", "target.path=/nonexistent/model"], "target.path"),
                                      (["target=hf", f"target.path={LLAMA}", "data.sampels=3"], "overrides"),
                                      (["target=hf", f"target.path={LLAMA}", "--gpus", "0"], "--gpus")])
def test_bad_input_is_one_line_naming_the_key(args, key, capsys):
    assert dispatch(["plan", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"config error: {key}"), err


def test_bytes_per_token_from_the_widths_until_the_pool_has_shards():
    manifest = {"bytes_per_token": 0.0, "dtype": "bfloat16",
                "shapes": {"features": [-1, 21504], "last_hidden": [-1, 7168]}}
    assert room.estimated_bytes_per_token(manifest) == (21504 + 7168) * 2 + 9 == 57353
    assert room.estimated_bytes_per_token({**manifest, "bytes_per_token": 1234.5}) == 1234.5


def test_training_memory_by_strategy(tmp_path):
    one = make(tmp_path, KIMI, "train.batch_tokens=16384").memory
    ddp = make(tmp_path, KIMI, "train.batch_tokens=16384", gpus=8).memory
    fsdp = make(tmp_path, KIMI, "train.batch_tokens=16384", "train.strategy=fsdp", gpus=8).memory
    p = make(tmp_path, KIMI).params
    states = "weights, grads, AdamW (fp32)"
    assert one.strategy == "single" and ddp.strategy == "ddp" and fsdp.strategy == "fsdp"
    assert one.parts[states] == 4 * p.total + 12 * p.trained
    assert ddp.parts[states] == one.parts[states] + 4 * p.trained  # DDP's gradient buckets
    assert fsdp.parts[states] == one.parts[states] / 8 + 4 * (p.root + p.largest_layer)
    assert one.tokens == 16384 and ddp.tokens == fsdp.tokens == 2048  # rows of up to train.max_seq_len
    assert ddp.parts["activations"] == fsdp.parts["activations"] == one.parts["activations"] / 8
    assert fsdp.total < ddp.total < one.total


def test_memory_estimate_within_10_percent_of_h100_readings():
    """benchmarks/plan_memory.py's peaks of real training steps on an H100 (nine draft shapes of the three targets)."""
    from types import SimpleNamespace

    from draftlab.plan.plan_estimates import train_memory
    from draftlab.target.target_shape import text_config

    readings = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h100_plan_memory.jsonl"
    rows = [json.loads(line) for line in readings.read_text().splitlines()]
    assert len(rows) == 9
    for r in rows:
        text = text_config(json.loads((DATA / r["config"] / "config.json").read_text()))
        L = text["num_hidden_layers"]
        draft = SimpleNamespace(hidden_size=None, intermediate_size=None, num_heads=None, num_kv_heads=None,
                                num_layers=r["layers"])
        shape = draft_shape(text, draft, [1, L // 2 - 1, L - 4], r["draft_vocab"], 2048)
        params = draft_params(shape)
        assert params.total == r["draft_params"]
        estimate = train_memory(shape, params, batch_tokens=r["batch_tokens"],
                                max_seq_len=r["batch_tokens"] // r["rows"], ttt_steps=r["ttt_steps"],
                                strategy="auto", gpus=1, amp=True, pool_dtype="bfloat16")
        assert abs(estimate.total / (r["measured_gb"] * 1e9) - 1) < 0.10, r


def test_plan_prints_the_best_setting_a_bench_measured_in_sglang(tmp_path):
    from draftlab.plan.stage_keys import plan as stage_plan

    cfg = validate(compose_config(["target=hf", f"target.path={LLAMA}", f"paths.root={tmp_path / 'root'}"]))
    (tmp_path / "root").mkdir()
    assert "best setting" not in plan_mod.sglang_command(cfg)  # nothing benched yet
    folder = stage_plan(cfg)["bench"].folder
    folder.mkdir(parents=True)
    best = {"steps": 3.0, "topk": 2.0, "num_draft_tokens": 6.0, "speedup": 2.4, "tau": 3.1}
    (folder / "manifest.json").write_text(json.dumps(
        {"metrics": {f"bench/sglang/grid_best/{k}": v for k, v in best.items()}}))
    line = plan_mod.sglang_command(cfg)
    assert line.endswith("the bench's best setting in SGLang: --speculative-algorithm EAGLE3 --speculative-num-steps 3 "
                         "--speculative-eagle-topk 2 --speculative-num-draft-tokens 6 (speed-up 2.4x at tau 3.1)")

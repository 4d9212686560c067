"""benchmarks/peers: the synthetic features writer, the conversion into the peers' formats, the summary's arithmetic
(steady window, MFU, ratios), and the harness end to end on a tiny pool: draftlab's trainer always, the peers
only where their environments are installed (benchmarks/peers/setup.sh, $PEERS). Timings are never asserted."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO
from draftlab.data.features import read_manifest
from draftlab.data.reader import FeatureSource, offline_entries
from draftlab.data.vocab import read_vocab, vocab_path

PEERS_DIR = REPO / "benchmarks" / "peers"
TINY = ["--hidden", "64", "--vocab", "256", "--draft-vocab", "64", "--layers", "8", "--heads", "4", "--kv-heads", "2",
        "--intermediate", "64", "--min-len", "16", "--max-len", "40", "--val-every", "4", "--per-shard", "5",
        "--device", "cpu"]


def load(name: str):
    """A benchmarks/peers script as a module (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"peers_{name}", PEERS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Path:
    synthetic = load("synthetic")
    out = tmp_path_factory.mktemp("synthetic") / "pool"
    synthetic.write_pool(out, synthetic.parse([str(out), "--samples", "12", *TINY]))
    return out


def test_the_synthetic_pool_is_an_extract_folder_of_the_asked_width(pool):
    manifest = read_manifest(pool)
    assert manifest["num_samples"] == 12 and len(manifest["shards"]) == 3  # 5 + 5 + 2
    assert manifest["shapes"] == {"features": [-1, 192], "last_hidden": [-1, 64]}
    assert manifest["layer_ids"] == [1, 3, 4] and manifest["target"]["config"]["vocab_size"] == 256
    shard = load_file(str(pool / "shard-00000.safetensors"))
    T = int(shard["offsets"][-1])
    assert shard["features"].shape == (T, 192) and shard["features"].dtype == torch.bfloat16
    assert shard["last_hidden"].shape == (T, 64) and shard["input_ids"].dtype == torch.int32
    assert shard["target_top"].shape == (T,) and shard["loss_mask"].dtype == torch.uint8
    assert shard["split"].tolist() == [0, 0, 0, 1, 0]  # every 4th sample is validation
    head = load_file(str(pool / "target_head.safetensors"))
    assert head["lm_head.weight"].shape == head["embed_tokens.weight"].shape == (256, 64)
    vocab = read_vocab(vocab_path(pool, 12, 64))
    assert vocab["d2t"].shape == (64,) and int(vocab["t2d"].sum()) == 64
    # draftlab's own reader takes it: 9 training and 3 validation samples
    source = FeatureSource(manifest, offline_entries(pool, manifest, 12), pool, 12, 64)
    assert (source.num_samples_in("train"), source.num_samples_in("val")) == (9, 3)


def test_the_synthetic_teacher_predicts_the_next_token_within_the_draft_vocabulary(pool):
    shard = load_file(str(pool / "shard-00000.safetensors"))
    head = load_file(str(pool / "target_head.safetensors"))["lm_head.weight"]
    ids, top, offsets = shard["input_ids"].long(), shard["target_top"].long(), shard["offsets"].tolist()
    hits = total = 0
    for a, b in zip(offsets, offsets[1:]):  # the state at t points at x_{t+1}
        hits += int((top[a : b - 1] == ids[a + 1 : b]).sum())
        total += b - a - 1
    assert hits / total > 0.9
    assert torch.equal(top, (shard["last_hidden"].float() @ head.T).argmax(-1))  # stored as extract stores it
    t2d = read_vocab(vocab_path(pool, 12, 64))["t2d"]
    assert t2d[ids].all()  # tokens come from a set of draft-vocabulary size: the vocabulary covers them
    rms = shard["features"].float().pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=0.02)


def test_conversion_writes_both_peer_formats_from_the_same_samples(pool, tmp_path):
    convert = load("convert")
    manifest = read_manifest(pool)
    is_val = convert.splits(pool, manifest, 12)
    train = sorted(i for i, v in is_val.items() if not v)
    row_of = {index: row for row, index in enumerate(train + sorted(i for i, v in is_val.items() if v))}
    norm, config = convert.write_target(pool, manifest, None, tmp_path / "target")
    assert set(load_file(str(tmp_path / "target" / "model.safetensors"))) == {
        "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"}
    assert torch.equal(norm, torch.ones(64)) and config["architectures"] == ["LlamaForCausalLM"]
    writers = convert.Writers(tmp_path, norm, 1e-5, row_of)
    samples = list(convert.samples(pool, manifest, 12))
    for s in samples:
        writers.add(s, is_val[s["index"]])
    first = samples[0]
    T = len(first["ids"])
    spec = load_file(str(tmp_path / "spec" / "hidden_states" / f"hs_{row_of[0]}.safetensors"))
    assert spec["hidden_states"].shape == (T, 4, 64) and torch.equal(spec["token_ids"], first["ids"])
    assert torch.equal(spec["hidden_states"][:, :3].reshape(T, 192), first["feats"])  # the aux layers, in order
    sf = torch.load(tmp_path / "sf" / "train" / "data_000000.ckpt", weights_only=True)  # written just above
    assert sf["aux_hidden_state"].shape == (1, T, 192) and sf["hidden_state"].shape == (1, T, 64)
    assert torch.equal(sf["hidden_state"][0], first["last"])  # SpecForge takes the normed state as it is
    assert writers.worst < 1e-2  # speculators' pre-norm state, normed again, is draftlab's
    assert len(list((tmp_path / "sf" / "eval").glob("*.ckpt"))) == 3


def test_the_steady_window_leaves_out_warm_up_and_evaluations():
    summary = load("summary")
    marks = [[s, 5.0 + 0.1 * s] for s in range(10, 101, 10)]  # 0.1 s a step after a 5 s compile
    rate = summary.steady_rate(marks, [], steps=100, tokens=10_000)  # 100 tokens a step
    assert rate["first_step"] == 20 and rate["steps"] == 80 and rate["tok_s"] == pytest.approx(1000)
    with_eval = summary.steady_rate(marks, [[10.0, 12.0], [0.0, 6.0]], steps=100, tokens=10_000)
    assert with_eval["seconds"] == pytest.approx(6.0)  # the 2 s pass inside; the compile-time span was outside
    assert summary.steady_rate(marks, [], steps=100, tokens=10_000, skip_until=95) is None  # one mark left
    assert summary.steady_rate(marks, [], steps=100, tokens=10_000, skip_until=42)["first_step"] == 50


def test_mfu_counts_model_flops_by_hand():
    summary = load("summary")
    draft = {"hidden_size": 4, "intermediate_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 2, "target_hidden_size": 4, "aux_layer_ids": [1, 2, 3], "vocab_size": 20,
             "draft_vocab_size": 10, "num_hidden_layers": 1}
    # fc 3*4*4 = 48; layer 0 (input 2H): 8*(2+2)*2 + 2*2*4 + 3*4*8 = 176; head 4*10 = 40; two documents of 3
    # tokens: effective length (9 + 9) / 6 = 3, keys (3+1)/2 + j for j = 0, 1: 5; attention 12*2*2*5 = 240
    split = {"draft": draft, "train_tokens": 6, "train_sq_tokens": 18}
    assert summary.effective_seq(6, 18) == 3
    assert summary.model_flops(split, ttt_steps=2) == pytest.approx(6 * 48 + 6 * (176 + 40) * 2 + 240)
    assert summary.mfu(3120.0, 1e9, 3.12) == pytest.approx(1.0)
    # the work a token needs, half the positions counted: fc 4x; step 0's keys and values (input 2H: 8*(2*1*2) =
    # 32) at every position; the rest of step 0, step 1 and the head (4x frozen, 6x trained) and attention at half
    needed = {**split, "train_loss_tokens": 3}
    frozen = 4 * 48 + 6 * 32 + 6 * (176 - 32) * 0.5 + 6 * 176 * 0.5 + 4 * 40 * 2 * 0.5 + 240 * 0.5
    assert summary.required_flops(needed, 2, head_trained=False) == pytest.approx(frozen)
    assert summary.required_flops(needed, 2, head_trained=True) == pytest.approx(frozen + 2 * 40 * 2 * 0.5)
    assert summary.required_flops(split, 2, head_trained=True) is None  # no loss-token count: no claim


@pytest.mark.parametrize("settings, trained", [
    ("speculators device=cuda ttt=7\n", False), ("specforge device=cuda ttt=7\n", True),
    ("draftlab device=cuda ttt=7\ndraftlab overrides: train.freeze_lm_head=true\n", False),
    ("draftlab device=cuda ttt=7\ndraftlab overrides: train.freeze_lm_head=false\n", True),
    ("draftlab device=cuda ttt=7\ndraftlab overrides: \n", True)])
def test_which_runs_train_their_head(settings, trained):
    assert load("summary").head_trained(settings) is trained


def test_same_round_ratios_and_their_medians():
    summary = load("summary")
    rounds = {1: {"dl-new": {"tok_s_steady": 300, "whole_job_s": 50, "val_loss": 9.9},
                  "speculators": {"tok_s_steady": 100, "whole_job_s": 100, "val_loss": 10.0}},
              2: {"dl-new": {"tok_s_steady": 200, "whole_job_s": 40, "val_loss": 9.9},
                  "speculators": {"tok_s_steady": 100, "whole_job_s": 60, "val_loss": 10.0}}}
    one = summary.ratios(rounds[1])["dl-new/speculators"]
    assert one["tok_s_steady"] == 3 and one["whole_job"] == 2 and one["val_loss_diff_pct"] == pytest.approx(-1)
    medians = summary.medians(rounds)
    assert medians["tok_s_steady"]["dl-new/speculators"] == 2.5
    assert medians["whole_job"]["dl-new/speculators"] == pytest.approx(1.75)


def test_a_run_over_several_epochs_counts_every_epochs_tokens(tmp_path):
    summary = load("summary")
    (tmp_path / "settings.txt").write_text("speculators device=cuda ttt=7 batch_tokens=8192 epochs=3 seed=1 \n")
    marks = [[s, 0.5 * s] for s in range(0, 61, 5)]  # 60 steps, half a second each
    (tmp_path / "timing.json").write_text(json.dumps({"train_s": 30.0, "train_cpu_s": 30.0, "steps": 60,
                                                      "marks": marks, "inner_spans": []}))
    run = summary.load_run(tmp_path, {"train_tokens": 10_000})
    assert run["ttt"] == 7 and run["tok_s_loop"] == pytest.approx(1_000)  # 3 x 10,000 tokens in 30 s
    assert run["tok_s_steady"] == pytest.approx(1_000)  # 500 tokens a step, 0.5 s a step


def test_quality_is_judged_against_the_rounds_seed_noise():
    summary = load("summary")

    def rounds(dl: list[float], peer: list[float]) -> dict:
        return {r: {"dl-new": {"val_loss": a}, "specforge": {"val_loss": b}} for r, (a, b) in enumerate(zip(dl, peer))}

    within = summary.quality(rounds([10.1, 9.9, 10.05], [10.0, 10.0, 10.0]))["dl-new/specforge"]
    assert within["above_pct"] == pytest.approx(0.5) and within["noise_pct"] == pytest.approx(2.0)
    behind = summary.quality(rounds([10.30, 10.31, 10.30], [10.0, 10.02, 10.01]))["dl-new/specforge"]
    assert behind["above_pct"] == pytest.approx(100 * 0.29 / 10.01)
    assert behind["noise_pct"] == pytest.approx(100 * 0.02 / 10.01)
    assert behind["above_pct"] > behind["noise_pct"] and within["above_pct"] < within["noise_pct"]
    one_seed = summary.quality(rounds([10.001] * 3, [10.0] * 3))["dl-new/specforge"]
    assert one_seed["noise_pct"] == 0 and one_seed["above_pct"] > 0  # no spread: any excess is behind


def test_a_peer_that_fails_every_round_is_shown_and_leaves_the_goal_unmet(tmp_path):
    def run(name: str, rc: int, log: str) -> None:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "rc").write_text(f"{rc}\n")
        (folder / "log.txt").write_text(log)
        (folder / "wall.txt").write_text("30.0")
        if rc == 0:
            marks = [[s, 5.0 + 0.1 * s] for s in range(5, 101, 5)]
            (folder / "timing.json").write_text(json.dumps({"train_s": 15.0, "train_cpu_s": 15.0, "steps": 100,
                                                            "marks": marks, "inner_spans": []}))

    for r in (1, 2):
        run(f"r{r}-dl-new", 0, "done\n")
        run(f"r{r}-specforge", 0, "done\n")
        run(f"r{r}-speculators", 1, "Traceback\n│ frame │\nRuntimeError: DataLoader worker exited unexpectedly\n")
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"n_train": 8, "train_tokens": 10_000, "train_sq_tokens": 10_000,
                                 "draft": {"hidden_size": 4, "intermediate_size": 8, "num_attention_heads": 2,
                                           "num_key_value_heads": 1, "head_dim": 2, "target_hidden_size": 4,
                                           "aux_layer_ids": [1, 2, 3], "vocab_size": 20, "draft_vocab_size": 10,
                                           "num_hidden_layers": 1}}))
    done = subprocess.run([sys.executable, str(PEERS_DIR / "summary.py"), str(tmp_path), str(split)],
                          capture_output=True, text=True, check=True)
    assert "| 1 | speculators | failed, rc 1: RuntimeError: DataLoader worker exited unexpectedly |" in done.stdout
    line = summary_line(done.stdout)
    assert line["median_steady_ratio"] == {"dl-new/specforge": 1.0}  # the pair that ran is still measured
    assert line["missing_pairs"] == ["dl-new/speculators"] and line["failed_rounds"] == {"speculators": [1, 2]}
    assert line["min_steady_ratio"] is None and line["min_steady_ratio_as_good"] is None
    record = json.loads((tmp_path / "round-1" / "results.json").read_text())
    assert record["runs"]["speculators"]["failed"] and "dl-new/speculators" not in record["ratios"]


def harness_env(tmp_path: Path, pool: Path, peers: str | None) -> tuple[dict, Path]:
    data, results = tmp_path / "data", tmp_path / "results"
    formats = ["--peers"] if peers is None else []
    python = sys.executable if peers is None else f"{peers}/venv-spec/bin/python"
    subprocess.run([python, str(PEERS_DIR / "convert.py"), str(pool), "12", str(data), "--dtype", "float32",
                    *formats], check=True, capture_output=True)
    results.mkdir()
    env = {**os.environ, "DATA": str(data), "RESULTS": str(results), "DL_TREE_new": str(REPO), "DEVICE": "cpu",
           "DL_PYTHON": sys.executable, "BATCH_TOKENS": "64", "PEERS_SYNC_EVERY": "1", "SHAPE": "tiny",
           "PYTHONPATH": ""}
    if peers:
        env["PEERS"] = peers
    return env, results


def summary_line(output: str) -> dict:
    return json.loads([line for line in output.splitlines() if line.startswith('{"shape"')][-1])


@pytest.mark.slow
def test_the_harness_runs_draftlab_end_to_end_on_a_tiny_pool(pool, tmp_path):
    env, results = harness_env(tmp_path, pool, None)
    # dl-slow: the same tree with one more override, a reference beside dl-new (DL_ARGS_<label>)
    done = subprocess.run(["bash", str(PEERS_DIR / "rounds.sh")],
                          env={**env, "ROUNDS": "2", "TRAINERS": "dl-new dl-slow", "DL_ARGS_slow": "train.lr=1e-5",
                               "EPOCHS": "2",
                               "PROFILE": "1", "PROFILE_AT": "2"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    for r in (1, 2):
        assert (results / f"r{r}-dl-new" / "rc").read_text().strip() == "0"
        assert f"epochs=2 seed={r - 1}" in (results / f"r{r}-dl-new" / "settings.txt").read_text()  # seed k - 1
        assert "train.lr=1e-5" in (results / f"r{r}-dl-slow" / "settings.txt").read_text()
        record = json.loads((results / f"round-{r}" / "results.json").read_text())
        run = record["runs"]["dl-new"]
        assert run["steps"] > 5 and run["whole_job_s"] > 0 and math.isfinite(run["val_loss"])
        assert run["tok_s_steady"] > 0 and run["gflop_per_token"] > 0
    assert "one training step" in (results / "r2-dl-new" / "profile.txt").read_text()  # the last round's profile
    # the evaluator scores draftlab's export as the trainer's own last validation pass did
    own = json.loads((results / "r1-dl-new" / "dl" / "metrics.json").read_text())["val/loss"]
    assert json.loads((results / "r1-dl-new" / "val.json").read_text())["val/loss"] == pytest.approx(own, rel=1e-3)
    line = summary_line(done.stdout)
    assert line["rounds"] == 2 and line["missing_pairs"] == [] and line["min_steady_ratio"] is None  # no peer ran
    # seeds 0 and 1 give different drafts; a 100x smaller lr leaves dl-slow's draft elsewhere again
    losses = {name: {json.loads((results / f"r{r}-{name}" / "val.json").read_text())["val/loss"] for r in (1, 2)}
              for name in ("dl-new", "dl-slow")}
    assert len(losses["dl-new"]) == 2 and not losses["dl-new"] & losses["dl-slow"]


@pytest.mark.slow
def test_the_peers_train_and_load_into_draftlabs_evaluator(pool, tmp_path):
    peers = os.environ.get("PEERS")
    if not peers or not all(Path(peers, v, "bin", "python").exists() for v in ("venv-spec", "venv-sf")):
        pytest.skip("speculators and SpecForge are optional installs: bash benchmarks/peers/setup.sh, then set PEERS "
                    "to the folder holding venv-spec and venv-sf")
    env, results = harness_env(tmp_path, pool, peers)
    # two data workers: speculators starts them by spawn, which re-imports its timed entry point; its forward
    # compiled with the eager loss, as run.sh trains it on a GPU
    done = subprocess.run(["bash", str(PEERS_DIR / "rounds.sh")],
                          env={**env, "ROUNDS": "1", "WORKERS": "2", "PEERS_COMPILE": "1"},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads((results / "round-1" / "results.json").read_text())["runs"]
    assert set(runs) == {"dl-new", "speculators", "specforge"}
    for name, run in runs.items():
        assert run["steps"] > 0 and math.isfinite(run["val_loss"]), name
        assert json.loads((results / f"r1-{name}" / "val.json").read_text())["same_vocab"], name
    assert set(summary_line(done.stdout)["median_steady_ratio"]) <= {"dl-new/speculators", "dl-new/specforge"}

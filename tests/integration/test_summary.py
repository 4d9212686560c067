"""Runs that explain themselves: the end-of-run table, and run names that say what varies."""

import logging

import pytest

from draftlab.tracking.run_names import job_run_name, run_name, sweep_keys, write_sweep_keys
from draftlab.tracking.summary import job_summary, mlflow_ui_command, sweep_summary
from draftlab.task import run_task

METRICS = {"best/val_loss": 2.5, "val/loss": 2.7, "best/val_acc_0": 0.41, "best/predicted_tau": 1.9,
           "bench/tau": 1.7, "bench/speedup": 1.25, "generate/seconds": 0.0, "generate/cached": 1.0,
           "extract/seconds": 3.25, "extract/cached": 0.0, "train/seconds": 12.0, "train/cached": 0.0,
           "bench/seconds": 4.0, "bench/cached": 0.0}


def test_job_summary_names_results_costs_warnings_and_where_to_look():
    uri = "sqlite:////data/mlruns/mlflow.db"
    text = job_summary(METRICS, {"draft_dir": "/o/train/abc/draft"}, ["bench: the draft is weak", "layers: last"],
                       uri, run_id="r123", experiment_id="7")
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in text.splitlines()
            if line.count("│") == 3 and line.split("│")[1].strip()}
    assert rows["val/loss"] == "2.5"  # the exported (best) epoch's numbers
    assert rows["acc_0 (val)"] == "0.41" and rows["predicted tau"] == "1.9"
    assert rows["bench tau"] == "1.7" and rows["speed-up"] == "1.25"
    assert rows["generate"] == "0.0 s (cached)" and rows["extract"] == "3.2 s" and rows["train"] == "12.0 s"
    assert rows["warnings"] == "- bench: the draft is weak"
    assert "- layers: last" in text
    assert rows["draft folder"] == "/o/train/abc/draft"
    command = mlflow_ui_command(uri)
    assert f"\n  {command}\n" in text + "\n"  # on a line of its own, whole
    assert command.endswith(f"ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000 --workers 1")
    assert "http://127.0.0.1:5000/#/experiments/7/runs/r123?workflowType=machine_learning" in text


def test_job_summary_shows_each_bench_set_with_its_interval():
    sets = {"bench/sharegpt_val/tau": 2.61, "bench/sharegpt_val/tau_lo": 2.55, "bench/sharegpt_val/tau_hi": 2.68,
            "bench/sharegpt_val/prompts": 80.0, "bench/sharegpt_val/speedup": 1.4,
            "bench/sharegpt_val/speedup_lo": 1.3, "bench/sharegpt_val/speedup_hi": 1.5,
            "bench/humaneval/tau": 1.9, "bench/humaneval/tau_lo": 1.5, "bench/humaneval/tau_hi": 2.3,
            "bench/humaneval/prompts": 80.0, "bench/bs1/speedup": 1.4, "bench/bs16/speedup": 0.9,
            "bench/bs4/speedup": 1.1, "bench/bs4/tau": 2.0, "bench/sharegpt_val/tf_tau": 3.05,
            "bench/sharegpt_val/walk_tau": 2.7, "bench/speedup_bound": 2.57, "bench/speedup_of_bound": 0.8519,
            "bench/draft_step_ms": 0.205, "bench/target_step_ms": 4.12, "bench/speedup_bound_with_verify": 2.43}
    text = job_summary({**METRICS, **sets}, {}, [], None)
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in text.splitlines()
            if line.count("│") == 3 and line.split("│")[1].strip()}
    assert rows["bench sharegpt_val"] == "tau 2.61 (95% 2.55-2.68, 80 prompts); speed-up 1.4x (95% 1.3-1.5)"
    # 0.8 wide at tau 1.9: more than 10% of it
    assert rows["bench humaneval"].startswith("tau 1.9 (95% 1.5-2.3, 80 prompts); too wide to decide anything")
    assert rows["speed-up by batch"] == "bs1 1.4x, bs4 1.1x, bs16 0.9x"
    assert "training's count 3.05, deployment's 2.7 (teacher-forced)" in text
    assert "bench bs4" not in rows  # a batch size is not a set
    assert rows["speed-up bound"] == "2.57x; 2.43x with the verify (draft 0.205, target 4.12 ms); reached 85%"


def test_a_cpu_bench_below_1x_says_why_in_one_line():
    """The README's first run ends below 1x on a CPU: the table says what the step costs allow, and where the
    GPU's measurement is; a GPU run or a run at 1x or more gets no such row."""
    slow = {**METRICS, "bench/tau": 1.31, "bench/speedup": 0.80, "bench/speedup_bound": 0.984,
            "bench/draft_step_ms": 4.77, "bench/target_step_ms": 57.5, "bench/speedup_of_bound": 0.81}
    cpu = {"bench/produced_on": "cpu"}
    text = " ".join(job_summary(slow, cpu, [], None).replace("│", " ").split())  # the table folds long lines
    assert ("why below 1x the step costs allow at most tau 1.31 / (1 + 4 draft steps x 4.77 ms / a 57.5 ms target"
            " step) = 0.984x") in text
    assert 'BENCHMARKS.md, "Speculative-decoding speed-up"' in text
    # a busy host: the steps alone would allow more than 1x, so what is missing is the engine's other work
    busy = {**slow, "bench/tau": 1.12, "bench/speedup": 0.444, "bench/speedup_bound": 1.08,
            "bench/draft_step_ms": 16.3, "bench/target_step_ms": 1550.0}
    text = " ".join(job_summary(busy, cpu, [], None).replace("│", " ").split())
    assert ("the step costs allow tau 1.12 / (1 + 4 draft steps x 16.3 ms / a 1550 ms target step) = 1.08x, of which"
            " the engine reached 41%") in text
    assert "why below 1x" not in job_summary(slow, {"bench/produced_on": "NVIDIA H200 (132 SMs)"}, [], None)
    assert "why below 1x" not in job_summary({**slow, "bench/speedup": 1.02}, cpu, [], None)
    assert "why below 1x" not in job_summary(METRICS, cpu, [], None)  # no step costs: nothing to explain with


def test_sweep_summary_has_a_row_per_job_and_the_verdict():
    jobs = [("samples=800 seed=0", {**METRICS, "bench/tau": 2.1}), ("samples=400 seed=0", METRICS)]
    text = sweep_summary(jobs, "data-limited: more data will help", "sqlite:////x/mlflow.db", "p1", "3")
    lines = text.splitlines()
    row = next(line for line in lines if "samples=800 seed=0" in line)
    assert [c.strip() for c in row.split("│")[1:-1]] == ["samples=800 seed=0", "2.5", "0.41", "1.9", "2.1",
                                                          "1.25", "-", "19"]
    assert any("samples=400 seed=0" in line for line in lines)
    capped = {**METRICS, "train/steps": 60.0, "train/converged": 0.0}
    converged = {**METRICS, "train/steps": 48.0, "train/converged": 1.0}
    text_steps = sweep_summary([("capped", capped), ("converged", converged)], None, None)
    cells = {line.split("│")[1].strip(): line.split("│")[-3].strip() for line in text_steps.splitlines()
             if line.count("│") == 9}
    assert cells == {"capped": "60 cap", "converged": "48"}  # a capped job never reads as a converged one
    assert "data-limited: more data will help" in text
    assert "http://127.0.0.1:5000/#/experiments/3/runs/p1?workflowType=machine_learning" in text


def test_a_run_ends_with_the_table_and_its_warnings(tiny_cfg, caplog, tmp_path):
    cfg = tiny_cfg("stages=[generate,extract]", "extract.layers=last", "tracking.enabled=false")
    with caplog.at_level(logging.INFO, logger="draftlab"):
        run_task(cfg, output_dir=tmp_path / "job")
    summary = caplog.records[-1].getMessage()
    assert "run summary" in summary
    assert "generate" in summary and "extract" in summary and "train " not in summary
    assert "last" in summary.split("warnings")[1]  # the `last` layers warning, raised during extract
    assert str(tmp_path / "job" / "results.json") in summary


def test_a_job_that_reuses_a_stage_repeats_its_warnings(tiny_cfg, caplog, tmp_path):
    """The `last` layers warning is raised while extract runs; a later job that finds extract cached (here
    another bench setting) must still show it, or its summary would say `none` about the same features."""
    cfg = tiny_cfg("stages=[generate,extract]", "extract.layers=last", "tracking.enabled=false")
    run_task(cfg)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="draftlab"):
        metrics = run_task(cfg, output_dir=tmp_path / "again")
    assert metrics["extract/cached"] == 1.0
    table = caplog.records[-1].getMessage().split("warnings")[1]
    warnings = " ".join(table.replace("│", " ").split())  # the table folds long lines
    assert "extract.layers=last is the one-layer ablation" in warnings
    assert "[repeated from the cached extract stage, produced by commit" in warnings


def test_a_stage_record_keeps_the_stages_warnings_not_the_stores():

    from draftlab.tracking.summary import (STAGE_WARNINGS_EXCLUDE, collect_warnings, repeat_stage_warnings,
                                           stage_warnings)

    with collect_warnings(exclude=STAGE_WARNINGS_EXCLUDE) as warned:
        logging.getLogger("draftlab.tracking.runs").warning("tracking: could not log to run r1")
        for i in range(25):
            logging.getLogger("draftlab").warning("bench: weak draft %d", i)
    kept = stage_warnings(warned)
    assert not any("tracking" in w for w in kept)
    assert len(kept) == 21 and kept[-1].startswith("... and 5 more warnings")
    with collect_warnings() as again:
        repeat_stage_warnings(logging.getLogger("draftlab.pipeline"), "bench", {"warnings": kept[:1],
                                                                                  "produced_by": "abc"})
    assert again.messages == ["bench: weak draft 0 [repeated from the cached bench stage, produced by commit abc]"]


@pytest.mark.parametrize("overrides, sweeper, expected", [
    (["train.lr=3e-4,1e-3", "target=tiny"], None, ["train.lr"]),
    (["experiment=data_scaling"], {"data.samples": "8,4", "train.seed": "0,1"}, ["data.samples", "train.seed"]),
    (["experiment=data_scaling", "train.seed=0"], {"data.samples": "8,4", "train.seed": "0,1"}, ["data.samples"]),
])
def test_sweep_keys_are_what_the_sweep_varies(overrides, sweeper, expected):
    assert sweep_keys(overrides, sweeper) == expected


def test_run_names_say_what_varies():
    job = ["experiment=data_scaling", "target=tiny", "train.epochs=16", "data.samples=6400"]
    assert run_name(job, ["data.samples", "train.epochs"]) == "samples=6400 epochs=16"
    # a single run: every override but the where-settings; clashing short names keep their group
    assert run_name(["data.seed=1", "train.seed=2", "paths.root=/x", "tracking.uri=sqlite:///y"]) == \
        "data.seed=1 train.seed=2"
    assert run_name(["paths.root=/x"]) is None  # nothing to say: MLflow picks a name


def test_a_sweep_job_names_itself_from_the_sweep_folder(tmp_path):
    from omegaconf import OmegaConf

    write_sweep_keys(tmp_path, ["data.samples", "train.seed"])
    hydra_cfg = OmegaConf.create({"overrides": {"task": ["target=tiny", "train.seed=1", "data.samples=50"]}})
    assert job_run_name(hydra_cfg, tmp_path) == "samples=50 seed=1"
    assert job_run_name(hydra_cfg, None) == "target=tiny seed=1 samples=50"

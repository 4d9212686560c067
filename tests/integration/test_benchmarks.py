"""`python -m draftlab benchmark`: the declarations in conf/benchmark/ compose, a run writes results.json and an
MLflow run in the `benchmarks` experiment, a failing command or a missing metric records nothing. Timings are
never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from draftlab.tracking import run_queries, runs as tracking
from draftlab.__main__ import main as draftlab_main
from draftlab.benchmarks import declarations
from draftlab.benchmarks.declarations import Benchmark, fill, render_args


def fake_repo(tmp_path: Path, monkeypatch, declaration: str) -> Path:
    """A checkout with one declaration, `fake`, and conf/config.yaml (how repo_root finds a checkout)."""
    (tmp_path / "conf" / "benchmark").mkdir(parents=True)
    (tmp_path / "conf" / "config.yaml").write_text("{}\n")
    (tmp_path / "conf" / "benchmark" / "fake.yaml").write_text(declaration)
    monkeypatch.chdir(tmp_path)
    return tmp_path


PRINTS = """device: cpu
goal: "fake: the printed rate at 2 or more"
metric: rate.{which}
goal_value: 2.0
read: json_lines
command: ["{{python}}", "-c", "import json, sys; print('noise'); print(json.dumps({{'rate': {{'a': 1.5, 'b': 3}}, 'runs': [4, 5], 'argv': sys.argv[1:]}}))"]
args: {{count: 3, quiet: true, skip: false, none: null}}
"""


def test_every_declaration_composes_with_a_goal_a_metric_and_a_command():
    names = declarations.names(REPO)
    assert {"generate", "extract", "train_step", "trainer", "spec_decode", "headline", "peers"} <= set(names)
    for name in names:
        bench = declarations.compose(name, root=REPO)
        assert bench.device in ("cpu", "gpu") and bench.goal and bench.metric and bench.command, name
    gpu = declarations.compose("train_step_gpu", ["args.steps=4"], root=REPO)  # inherits train_step, overridden
    assert gpu.args["preset"] == "llama8b" and gpu.args["steps"] == 4 and gpu.metric == "mfu"
    assert declarations.missing(declarations.compose("spec_decode_gpu", root=REPO)) == ["args.draft", "args.samples"]
    with pytest.raises(ValueError, match="no benchmark"):
        declarations.compose("nonesuch", root=REPO)


def test_hardware_picks_the_declaration_for_that_machine():
    gpu = declarations.compose("peers", ["hardware=gpu", "env.ROUNDS=5"], root=REPO)
    assert (gpu.name, gpu.device, str(gpu.env["ROUNDS"])) == ("peers_gpu", "gpu", "5")
    cpu = declarations.compose("peers_gpu", ["hardware=cpu"], root=REPO)
    assert (cpu.name, cpu.device) == ("peers", "cpu")
    assert declarations.compose("headline", ["hardware=gpu"], root=REPO).name == "headline"  # its own machine
    with pytest.raises(ValueError, match="hardware=gpu: benchmark trainer runs on cpu"):
        declarations.compose("trainer", ["hardware=gpu"], root=REPO)
    with pytest.raises(ValueError, match="hardware must be one of cpu, gpu, not 'tpu'"):
        declarations.compose("peers", ["hardware=tpu"], root=REPO)


def test_the_list_command_names_every_benchmark(capsys):
    assert draftlab_main(["benchmark", "--list"]) == 0
    shown = capsys.readouterr().out
    assert all(name in shown for name in declarations.names(REPO))


def test_args_render_as_flags_or_hydra_overrides():
    flags = Benchmark("b", "cpu", "g", "m", "json_lines", ["x"],
                      args={"batch_tokens": 512, "shm": True, "no_disk": False, "threads": None, "writers": [1, 4]})
    assert render_args(flags) == ["--batch-tokens", "512", "--shm", "--writers", "1", "4"]
    hydra = Benchmark("b", "cpu", "g", "m", "run_results", ["x"], arg_style="hydra",
                      args={"stages": "[generate]", "tracking": {"enabled": False}, "experiment": None})
    assert render_args(hydra) == ["stages=[generate]", "tracking.enabled=false"]


def test_placeholders_fill_in_and_a_glob_must_match(tmp_path):
    (tmp_path / "root" / "generate" / "abc").mkdir(parents=True)
    assert fill("{python}", tmp_path) == sys.executable
    assert fill("{out}/x", tmp_path) == f"{tmp_path}/x"
    assert fill("{glob:root/generate/*}", tmp_path) == str(tmp_path / "root" / "generate" / "abc")
    with pytest.raises(FileNotFoundError):
        fill("{glob:root/extract/*}", tmp_path)


def test_goal_met_follows_the_direction():
    up = Benchmark("b", "cpu", "g", "m", "json_lines", ["x"], goal_value=2.0)
    down = Benchmark("b", "cpu", "g", "m", "json_lines", ["x"], goal_value=2.0, higher_is_better=False)
    assert (up.met(3.0), up.met(1.0), down.met(1.0), down.met(3.0)) == (True, False, True, False)
    assert Benchmark("b", "cpu", "g", "m", "json_lines", ["x"]).met(1.0) is None


def test_a_run_writes_results_json_and_an_mlflow_run(tmp_path, monkeypatch, capsys):
    fake_repo(tmp_path / "repo", monkeypatch, PRINTS.format(which="b"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert draftlab_main(["benchmark", "fake", "args.count=5", "--out", str(tmp_path / "out"),
                          "--tracking-uri", uri]) == 0
    record = json.loads((tmp_path / "out" / "results.json").read_text())
    assert record["benchmark"] == "fake" and record["metric"] == "rate.b" and record["value"] == 3.0
    assert record["met"] is True and record["numbers"]["rate.a"] == 1.5 and "command_wall_s" in record["numbers"]
    assert record["numbers"]["runs.1"] == 5.0 and "argv" not in record["numbers"]
    assert record["command"][1] == "-c" and record["command"][-3:] == ["--count", "5", "--quiet"]
    assert record["records"][0]["argv"] == ["--count", "5", "--quiet"]  # false and null left out
    assert record["machine"]["cpu_count"] and record["machine"]["python"] and record["commit"]
    assert "noise" in (tmp_path / "out" / "output.txt").read_text()
    client = tracking.open_client(uri)
    runs = run_queries.search_runs(client, [run_queries.find_experiment_id(client, "benchmarks")])
    assert [r.info.run_id for r in runs] == [record["mlflow_run_id"]]
    assert runs[0].data.metrics["rate.b"] == 3.0 and runs[0].data.tags["benchmark.met"] == "true"
    assert runs[0].data.params["benchmark"] == "fake"
    assert "rate.b (deciding)" in capsys.readouterr().out


def test_a_missing_metric_or_a_failing_command_records_nothing(tmp_path, monkeypatch):
    fake_repo(tmp_path / "repo", monkeypatch, PRINTS.format(which="c"))
    assert draftlab_main(["benchmark", "fake", "--out", str(tmp_path / "a"), "--no-tracking"]) == 1
    assert not (tmp_path / "a" / "results.json").exists()
    failing = "command=['{python}','-c','raise SystemExit(3)']"
    assert draftlab_main(["benchmark", "fake", failing, "--out", str(tmp_path / "b"), "--no-tracking"]) == 1
    assert not (tmp_path / "b" / "results.json").exists()
    assert draftlab_main(["benchmark", "nonesuch", "--no-tracking"]) == 2


@pytest.mark.slow
def test_the_generate_benchmark_runs_the_stage_on_the_tiny_target(tmp_path):
    """The real thing from a checkout: the generate stage under experiment=smoke, its metric from results.json."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = subprocess.run([sys.executable, "-m", "draftlab", "benchmark", "generate", "--out", str(tmp_path / "g"),
                           "--tracking-uri", uri], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "g" / "results.json").read_text())
    assert record["value"] == record["numbers"]["generate/tokens_per_s"] > 0
    assert record["numbers"]["generate/samples"] == 32 and record["command"][1] == "src/run.py"
    client = tracking.open_client(uri)
    runs = run_queries.search_runs(client, [run_queries.find_experiment_id(client, "benchmarks")])
    assert runs[0].data.metrics["generate/tokens_per_s"] == record["value"]


KEEPS = """device: cpu
goal: "fake: a table kept beside results.json"
metric: rate
read: json_lines
keep: ["root/**/per_prompt.json"]
command: ["{python}", "-c", "import json, pathlib, sys; d = pathlib.Path(sys.argv[1], 'root', 'runs', 'x', 'bench'); d.mkdir(parents=True); (d / 'per_prompt.json').write_text('{\\"rows\\": []}'); print(json.dumps({'rate': 1}))", "{out}"]
"""


def test_keep_copies_the_per_prompt_table_beside_results_json(tmp_path, monkeypatch):
    fake_repo(tmp_path / "repo", monkeypatch, KEEPS)
    assert draftlab_main(["benchmark", "fake", "--out", str(tmp_path / "out"), "--no-tracking"]) == 0
    record = json.loads((tmp_path / "out" / "results.json").read_text())
    assert record["kept"] == ["per_prompt.json"]
    assert json.loads((tmp_path / "out" / "per_prompt.json").read_text()) == {"rows": []}
    missing = "keep=[root/**/nothing.json]"
    assert draftlab_main(["benchmark", "fake", missing, "--out", str(tmp_path / "b"), "--no-tracking"]) == 1
    assert not (tmp_path / "b" / "results.json").exists()  # no result without what re-derives it


def test_the_headline_keeps_its_per_prompt_table():
    assert declarations.compose("headline").keep == ["root/**/per_prompt.json"]


RATE = "import json; print(json.dumps({{'rate': {rate}, 'code': '{code}'}}))\n"
COMPARES = """device: cpu
goal: "fake: 3x the reference's rate"
metric: ratio
goal_value: 3.0
read: json_lines
command: ["{python}", tool.py]
reference: {metric: rate, commit: "{required}"}
"""


def git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_reference_runs_at_its_commit_and_the_ratio_is_recorded(tmp_path, monkeypatch):
    """One command measures this checkout and the reference commit in its own worktree: each prints its own rate
    (6 here, 2 there), so a reference run on this checkout's code would give a ratio of 1, not 3."""
    repo = fake_repo(tmp_path / "repo", monkeypatch, COMPARES)
    git(repo, "init", "-q")
    (repo / "tool.py").write_text(RATE.format(rate=2, code="old"))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "reference")
    old = git(repo, "rev-parse", "HEAD")
    (repo / "tool.py").write_text(RATE.format(rate=6, code="new"))
    git(repo, "commit", "-q", "-am", "faster")
    assert draftlab_main(["benchmark", "fake", f"reference.commit={old[:7]}", "--out", str(tmp_path / "out"),
                          "--no-tracking"]) == 0
    record = json.loads((tmp_path / "out" / "results.json").read_text())
    assert record["records"][0]["code"] == "new" and record["reference"]["records"][0]["code"] == "old"
    assert record["numbers"]["rate"] == 6.0 and record["numbers"]["reference.rate"] == 2.0
    assert record["value"] == record["numbers"]["ratio"] == 3.0 and record["met"] is True
    assert record["reference"]["commit"] == old and record["commit"] == git(repo, "rev-parse", "HEAD")
    assert record["reference"]["compare"] == "rate" and record["reference"]["value"] == 2.0
    assert len(git(repo, "worktree", "list").splitlines()) == 1  # the reference's worktree is gone
    assert (tmp_path / "out" / "reference" / "output.txt").exists()


def test_every_result_records_its_commit_machine_and_date(tmp_path, monkeypatch):
    fake_repo(tmp_path / "repo", monkeypatch, PRINTS.format(which="b"))
    git(tmp_path / "repo", "init", "-q")
    git(tmp_path / "repo", "add", "-A")
    git(tmp_path / "repo", "commit", "-q", "-m", "one")
    assert draftlab_main(["benchmark", "fake", "--out", str(tmp_path / "out"), "--no-tracking"]) == 0
    record = json.loads((tmp_path / "out" / "results.json").read_text())
    assert record["commit"] == git(tmp_path / "repo", "rev-parse", "HEAD") and record["dirty"] == "false"
    assert record["date"] == record["started"][:10] and len(record["date"]) == 10
    assert record["machine"]["name"] and record["machine"]["name"] != "unknown"


def test_the_machine_is_named_by_its_gpus_else_its_cpu():
    from draftlab.benchmarks.record import machine_name

    assert machine_name("AMD EPYC 9654", []) == "AMD EPYC 9654"
    assert machine_name("x", ["NVIDIA H200, 143771 MiB, 580.1"]) == "NVIDIA H200"
    assert machine_name("x", ["NVIDIA H100 80GB HBM3, 81559 MiB, 580.1"] * 2) == "2 x NVIDIA H100 80GB HBM3"


def test_the_gpu_rows_against_the_reference_declare_it():
    for name, metric in (("generate_gpu", "generate/tokens_per_s"), ("train_stage_gpu", "late")):
        bench = declarations.compose(name, root=REPO)
        assert bench.metric == "ratio" and bench.goal_value == 5.0, name
        assert bench.reference["commit"] == "5c67ce0" and bench.reference["metric"] == metric, name
        ref = declarations.reference_benchmark(bench)
        assert ref.command and ref.read in declarations.READ_KINDS, name


def test_stage_windows_reads_the_late_rate_without_the_windows_after_a_pass():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import stage_windows

    records = [{"t": 0.0, "step": 0}, {"t": 1.0, "step": 10, "train/tokens_per_s": 100.0},
               {"t": 2.0, "step": 20, "train/tokens_per_s": 100.0}, {"t": 7.0, "step": 20, "val/loss": 1.0},
               {"t": 9.0, "step": 30, "train/tokens_per_s": 999.0},  # after the pass: its seconds hold the pass
               {"t": 10.0, "step": 40, "train/tokens_per_s": 300.0}]
    found = stage_windows.readings(records)
    assert found["late"] == 300.0 and found["steady"] == 200.0 and found["last_window"] == 300.0

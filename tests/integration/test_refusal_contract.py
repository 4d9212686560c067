"""One refusal contract for every entry point: bad input gives one console line naming the key, file or value,
exit code 2, no traceback, and nothing created. Each command's cases come from its own arguments and the config
keys it reads that name a file or a count; most run in-process (seconds), a few as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, tiny_overrides
from draftlab.__main__ import COMMANDS, main
from sglang_fixtures import write_draft, write_target

# commands that only the pipeline or DVC starts, with arguments it writes itself
INTERNAL = {"stage", "warm-compile", "warm-decode"}


@pytest.fixture
def inputs(tmp_path):
    """Bad inputs on disk, and the names of what a refusal must leave uncreated."""
    made = {"draft": write_draft(tmp_path / "draft"), "model": write_target(tmp_path / "model")}
    for name, config in {"wrapper": {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25"},
                         "notobject": [1, 2], "noarch": {"model_type": "llama", "num_hidden_layers": 4,
                                                         "hidden_size": 8, "vocab_size": 16}}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    (tmp_path / "empty").mkdir()
    (tmp_path / "a_file").write_text("keep")
    (tmp_path / "nolayers.json").write_text(json.dumps({"format": "draftlab.features/1"}))
    (tmp_path / "blank.jsonl").write_text("\n")
    return tmp_path


def cases(t):
    """(command argv, text the one line must hold): derived from each command's arguments and keys."""
    target = lambda folder: ["target=hf", f"target.path={t / folder}", f"paths.root={t / 'out'}"]  # noqa: E731
    return [
        (["plan", *target("model/config.json")], "target.path"),  # a file where a folder belongs
        (["plan", *target("notobject")], "not an object"),
        (["plan", *target("wrapper")], "text_config"),
        (["plan", *target("noarch")], "SGLang reads only that field"),
        (["plan", *target("missing")], "target.path"),
        (["plan", "--answer-tokens", "-3", *target("model")], "--answer-tokens"),
        (["plan", "--gpus", "0", *target("model")], "--gpus"),
        (["plan", "data.smaples=3"], "smaples"),
        (["plan", "data.samples=-1", *target("model")], "data.samples"),
        (["benchmark", "train_step", "args.stpes=20", "--no-tracking"], "args.stpes"),
        (["benchmark", "no_such_benchmark"], "no_such_benchmark"),
        (["bundle", str(t / "a_file")], "a_file"),
        (["bundle", str(t / "model")], "config.json"),
        (["convert", str(t / "draft"), str(t / "model"), "--to", "speculators"], "--force"),
        (["convert", str(t / "draft"), str(t / "new"), "--to", "speculators", "--speculative-tokens", "0"],
         "--speculative-tokens"),
        (["convert", str(t / "missing"), str(t / "new"), "--to", "sglang"], "missing"),
        (["check-draft", str(t / "missing")], "missing"),
        (["check-draft", str(t / "empty")], "no config.json"),
        (["check-draft", str(t / "draft"), "--target", str(t / "missing")], "no such folder"),
        (["check-draft", str(t / "draft"), "--extract-manifest", str(t / "missing.json")], "missing.json"),
        (["check-draft", str(t / "draft"), "--extract-manifest", str(t / "nolayers.json")], "layers"),
        (["import-runs", str(t / "empty"), "--experiment", "x"], "results.json"),
        (["draft-contract", "--python", str(t / "missing")], "missing"),
        (["intervals", str(t / "missing.json")], "missing.json"),
        (["capture-contract", "--python", str(t / "missing")], "missing"),
        # argparse's own refusals: one line naming the argument, not the whole usage
        (["check-draft", str(t / "draft"), "--rules", "newest"], "--rules"),
        (["convert", str(t / "draft"), str(t / "new")], "--to"),
        (["plan", "--gpus", "two"], "--gpus"),
        (["bundle"], "out"),
        (["benchmark", "--bogus"], "--bogus"),
        (["import-runs", str(t / "empty")], "--experiment"),
        (["draft-contract", "--wirte"], "--wirte"),
    ]


def test_every_command_has_refusal_cases(tmp_path):
    covered = {argv[0] for argv, _ in cases(tmp_path)}
    assert sorted(set(COMMANDS) - INTERNAL - covered) == []


@pytest.mark.parametrize("index", range(len(cases(REPO))))
def test_a_command_refuses_bad_input_in_one_line(inputs, capsys, index):
    argv, named = cases(inputs)[index]
    before = sorted(p.name for p in inputs.iterdir())
    snapshot = {p: p.read_bytes() for p in inputs.rglob("*") if p.is_file()}
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "%|" not in line]
    assert code == 2, (argv, err)
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in err, (argv, err)
    assert sorted(p.name for p in inputs.iterdir()) == before  # nothing created
    assert all(p.read_bytes() == data for p, data in snapshot.items())  # nothing changed


@pytest.mark.parametrize("argv, named", [
    (["data_scaling", "--records", "{t}/missing.jsonl"], "missing.jsonl"),
    (["data_scaling", "--records", "{t}/blank.jsonl", "--report", "{t}/nofolder/report.md"], "blank.jsonl"),
    (["data_scaling", "--records", "{t}/blank.jsonl", "--boot", "0"], "--boot"),
    (["data_scaling", "--records", "{t}/blank.jsonl", "--level", "1.5"], "--level"),
    (["data_scaling", "--boot", "many"], "--boot"),
    (["no_such_sweep", "--tracking-uri", "sqlite:///{t}/none.db"], "none.db"),  # the store is not created
])
def test_analyze_refuses_bad_input_in_one_line(inputs, capsys, argv, named):
    from draftlab.tracking.analyze import main as analyze

    before = sorted(p.name for p in inputs.iterdir())
    try:
        code = analyze([a.format(t=inputs) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and named in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in inputs.iterdir()) == before


def run(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd)


def test_as_processes_the_commands_exit_2_without_a_traceback(inputs):
    for argv in (["plan", "target=hf", f"target.path={inputs / 'wrapper'}"],
                 ["convert", str(inputs / "draft"), str(inputs / "model"), "--to", "sglang"]):
        done = run("-m", "draftlab", *argv)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr


def test_run_py_refuses_a_wrapper_without_text_config_before_creating_anything(inputs):
    job = inputs / "job"
    done = run(str(REPO / "src" / "run.py"), *tiny_overrides(inputs, "target=hf", f"target.path={inputs / 'wrapper'}",
                                                             f"hydra.run.dir={job}"))
    console = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in console, console
    assert len([line for line in console.splitlines() if "text_config" in line]) == 1, console
    assert "Traceback" in (job / "run.log").read_text()
    assert not (inputs / "out" / "generate").exists() and not (inputs / "mlflow.db").exists()


def test_run_py_refuses_a_bench_set_without_prompts_before_generate(inputs):
    done = run(str(REPO / "src" / "run.py"), *tiny_overrides(inputs, f"bench.sets=[{inputs / 'blank.jsonl'}]",
                                                             f"hydra.run.dir={inputs / 'job'}"))
    console = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in console, console
    assert "bench.sets" in console and not (inputs / "out" / "generate").exists(), console


def test_run_py_ends_a_bench_alarm_in_its_own_message_with_exit_2(inputs):
    """The alarm (deployed tau at or below bench.tau_fail) is a verdict on the draft, not a fault of draftlab:
    src/run.py, with a job whose bench raises it, ends in the alarm's message and exit 2."""
    script = inputs / "alarm_job.py"
    script.write_text(textwrap.dedent(f"""
        import runpy, sys
        import draftlab.task
        from draftlab.serve.alarm import DraftAlarm

        def alarm(*args, **kwargs):
            raise DraftAlarm("bench: tau 1.00 <= bench.tau_fail 1.20: the draft accepts nothing", {{}})

        draftlab.task.run_task = alarm
        sys.argv = ["run.py", *{tiny_overrides(inputs, f"hydra.run.dir={inputs / 'job'}")!r}]
        runpy.run_path({str(REPO / "src" / "run.py")!r}, run_name="__main__")
    """))
    done = run(str(script))
    console = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in console, console
    assert "error: bench: tau 1.00 <= bench.tau_fail 1.20" in console
    assert "Traceback" in (inputs / "job" / "run.log").read_text()


def _int_keys(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _int_keys(value, f"{prefix}{key}.")
        elif isinstance(value, int) and not isinstance(value, bool):
            yield f"{prefix}{key}"


def test_every_count_in_the_config_is_refused_negative_naming_its_key(tmp_path):
    """Derived from the composed config itself: a count or size set to -1 is refused by validation, before
    anything runs, in a message that starts with its key."""
    from omegaconf import OmegaConf

    from draftlab.config.config import ConfigError, compose_conf, validate

    base = tiny_overrides(tmp_path, "serve=sglang")
    keys = sorted(_int_keys(OmegaConf.to_container(compose_conf(base), resolve=False)))
    assert len(keys) > 30
    passed = []
    for key in keys:
        try:
            validate(compose_conf([*base, f"{key}=-1"]))
            passed.append(key)
        except ConfigError as err:
            if not str(err).startswith(f"{key}:"):
                passed.append(f"{key} ({err})")
    assert passed == []


@pytest.mark.parametrize("key, value", [
    ("target.path", "{t}/missing"), ("target.path", "{t}/model/config.json"), ("data.path", "{t}/missing.jsonl"),
    ("bench.sets", "[{t}/missing.jsonl]"), ("bench.sets", "[{t}/blank.jsonl]"), ("train.init_from", "{t}/missing"),
    ("paths.root", "{t}/missing/out"), ("extract.pool_root", "{t}/a_file/pool"),
])
def test_every_key_naming_a_file_is_refused_in_preflight_naming_it(inputs, key, value):
    from draftlab.config.config import ConfigError, compose_conf, validate
    from draftlab.checks.preflight import preflight

    extra = {"target.path": ["target=hf"], "data.path": ["data.source=jsonl"]}.get(key, [])
    overrides = [*tiny_overrides(inputs, *extra), f"{key}={value.format(t=inputs)}"]
    before = sorted(p.name for p in inputs.iterdir())
    with pytest.raises(ConfigError) as err:
        preflight(validate(compose_conf(overrides)))
    assert str(err.value).startswith(f"{key}:") and len(str(err.value).splitlines()) == 1, err.value
    # paths.root itself may be made (Hydra's job folder, which keeps run.log, lives under it), and its key
    # cache (.cache) written; no stage folder
    assert sorted(p.name for p in inputs.iterdir() if p.name != "out") == before
    assert not (inputs / "out").exists() or [p.name for p in (inputs / "out").iterdir()] in ([], [".cache"])


@pytest.mark.parametrize("override, named", [("data.smaples=3", "data.smaples"), ("target=hff", "target/hff")])
def test_run_py_refuses_a_misspelt_override_in_one_line(inputs, override, named):
    done = run(str(REPO / "src" / "run.py"), *tiny_overrides(inputs, override, f"hydra.run.dir={inputs / 'job'}"))
    console = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and "Traceback" not in console and len(console.splitlines()) == 1, console
    assert named in console and not (inputs / "job").exists() and not (inputs / "out").exists()

"""Stage keys know the code: editing a stage's modules reruns that stage and the stages after it, not the
ones before it, under src/run.py's pipeline (here) and under `dvc repro` (tests/integration/test_dvc.py)."""

import shutil

import pytest
import yaml

from conftest import REPO
from draftlab.provenance import code_version
from draftlab.config.config import validate
from draftlab.plan.stage_keys import STAGES, plan


@pytest.fixture
def package_copy(tmp_path, monkeypatch):
    """A copy of the draftlab sources that the keys are computed from, to edit without touching the repo."""
    copy = tmp_path / "src" / "draftlab"
    shutil.copytree(code_version.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(code_version, "PACKAGE_ROOT", copy)
    return copy


def _append_comment(file):
    file.write_text(file.read_text() + "\n# an edit\n")


def test_stage_code_is_what_the_stage_imports():
    modules = {name: set(code_version.stage_modules(name)) for name in STAGES}
    assert "draftlab.train.loop" in modules["train"] and "draftlab.train.ttt" in modules["train"]
    assert "draftlab.serve.engine" in modules["bench"] and "draftlab.data.features" in modules["extract"]
    assert "draftlab.data.prompts" in modules["generate"]
    assert not any(m.startswith("draftlab.train") for m in modules["generate"] | modules["extract"])
    # the reader is training's alone: a change to it leaves every extracted pool valid
    assert "draftlab.data.reader" in modules["train"] and "draftlab.data.reader" not in modules["extract"]
    assert "draftlab.pipeline" not in set().union(*modules.values())  # no stage depends on the runner


def test_editing_train_code_changes_train_and_bench_keys_only(tiny_cfg, package_copy):
    cfg = validate(tiny_cfg())
    before = plan(cfg)
    _append_comment(package_copy / "train" / "loop.py")
    after = plan(cfg)
    assert after["generate"].key == before["generate"].key and after["extract"].key == before["extract"].key
    assert after["train"].folder != before["train"].folder and after["bench"].key != before["bench"].key


def test_editing_generate_code_starts_a_new_pool(tiny_cfg, package_copy):
    cfg = validate(tiny_cfg())
    before = plan(cfg)
    _append_comment(package_copy / "data" / "prompts.py")
    after = plan(cfg)
    assert all(after[name].folder != before[name].folder for name in STAGES)


def test_edited_train_code_reruns_train_and_bench_under_run_task(tiny_cfg, package_copy, monkeypatch):
    from draftlab import pipeline
    from draftlab.util.reporting import RecordingReporter
    from draftlab.task import run_task

    commits = iter(["1111", "2222"])
    monkeypatch.setattr(pipeline, "git_state", lambda _root: {"git.commit": next(commits), "git.dirty": "false"})
    cfg = tiny_cfg("data.samples=16", "tracking.enabled=false")
    first = run_task(cfg)
    assert all(first[f"{name}/cached"] == 0 for name in STAGES)

    _append_comment(package_copy / "train" / "loop.py")
    reporter = RecordingReporter()
    monkeypatch.setattr("draftlab.task.RecordingReporter", lambda: reporter)
    second = run_task(cfg)
    assert second["generate/cached"] == 1 and second["extract/cached"] == 1
    assert second["train/cached"] == 0 and second["bench/cached"] == 0
    # A reused stage names the commit that made it, a rerun one the commit that runs now.
    assert reporter.tags["generate/produced_by"] == "1111" and reporter.tags["extract/produced_by"] == "1111"
    assert reporter.tags["train/produced_by"] == "2222" and reporter.tags["bench/produced_by"] == "2222"
    # and the device it ran on: the reused record's, the CPU here
    assert {reporter.tags[f"{name}/produced_on"] for name in STAGES} == {"cpu"}


def test_dvc_yaml_lists_each_stage_code_as_deps():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name in STAGES:
        listed = {dep for dep in stages[name].get("deps", []) if dep.startswith("src/")}
        expected = {str(path.relative_to(REPO)) for path in code_version.stage_files(name)}
        assert listed == expected, (f"dvc.yaml stage {name}: code deps should be exactly\n"
                                    + "\n".join(f"      - {dep}" for dep in sorted(expected))
                                    + "\n(python scripts/dvc_code_deps.py rewrites them)")


def test_an_extract_pool_made_by_other_code_starts_over(tmp_path, monkeypatch):
    """Under DVC the extract folder is fixed: after an edit to extract's code, `dvc repro` reruns the stage,
    which must start the pool over, not find it complete and keep features made by the old code."""
    from draftlab.config.config import default_config
    from draftlab.data.samples import write_samples
    from draftlab.util.reporting import RecordingReporter
    from draftlab.stages import extract
    from test_extract import make_samples

    write_samples(tmp_path / "generate", make_samples(), shard_size=8)
    cfg = default_config({"target": {"name": "tiny"}, "paths": {"root": str(tmp_path)}, "data": {"samples": 10},
                          "extract": {"dtype": "float32", "batch_size": 1, "shard_size": 4},
                          "draft": {"vocab_size": 64}})

    def run():
        return extract.run(cfg, tmp_path / "extract", {"generate": tmp_path / "generate"}, RecordingReporter())

    assert run()["extract/new_samples"] == 10
    assert run()["extract/new_samples"] == 0  # same code: the pool is complete
    monkeypatch.setattr(extract, "code_version", lambda name: "edited")
    assert run()["extract/new_samples"] == 10


def test_a_copy_without_git_records_the_commit_its_launcher_names(tmp_path, monkeypatch):
    """GPU machines run a `git archive` copy: DRAFTLAB_GIT_COMMIT names its commit, else it is 'unknown'; whether the
    copy was edited is unknown either way."""
    from draftlab.provenance.provenance import git_state

    monkeypatch.delenv("DRAFTLAB_GIT_COMMIT", raising=False)
    assert git_state(tmp_path) == {"git.commit": "unknown", "git.dirty": "unknown"}
    monkeypatch.setenv("DRAFTLAB_GIT_COMMIT", "abc123\n")
    assert git_state(tmp_path) == {"git.commit": "abc123", "git.dirty": "unknown"}

"""benchmarks/paired_val_loss.py pairs two codes' runs by seed: the differences are taken within a seed, only at the
passes every run reached, the verdict reads the interval against the margin, a stopped comparison resumes
without running a finished pair again, and a pair trained on different features is refused while its other
differing params are shown. The jobs here are stub `run.py`s that write what the real job writes."""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import benchmark_script

STUB = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    code = Path(__file__).resolve().parents[1]
    assert os.environ["PYTHONPATH"] == str(code / "src"), os.environ["PYTHONPATH"]
    with open(code / "calls.txt", "a") as f:
        f.write(f"{args['train.seed']} {os.environ.get('DRAFTLAB_GIT_COMMIT')} {args['train.max_steps']}\\n")
    seed, shift = int(args["train.seed"]), float((code / "SHIFT").read_text())
    train = Path(args["paths.root"]) / "train" / f"{code.name}-{seed}"
    (train / "draft").mkdir(parents=True)
    history = [{"step": s, "val/loss": (10.0 / s + seed) * (1 + shift)} for s in (10, 20)]
    (train / "manifest.json").write_text(json.dumps({"history": history}))
    (Path(args["hydra.run.dir"]) / "results.json").write_text(
        json.dumps({"metrics": {"val/loss": history[-1]["val/loss"]}, "params": {"train.seed": str(seed)},
                    "tags": {"draft_dir": str(train / "draft"), "fingerprint.extract": "f"}}))
""")


def _record(tag, seed, losses):
    return {"tag": tag, "seed": seed, "history": [{"step": s, "val/loss": v} for s, v in losses.items()]}


def test_pairs_within_a_seed_at_the_passes_all_runs_reached():
    pv = benchmark_script("paired_val_loss")
    records = [_record("base", 0, {10: 2.0, 20: 1.0}), _record("new", 0, {10: 2.02, 20: 1.01, 30: 0.5}),
               _record("base", 1, {10: 4.0, 20: 2.0}), _record("new", 1, {10: 3.96, 20: 2.03}),
               _record("new", 2, {10: 9.0, 20: 9.0})]  # no base run: not paired
    rows = pv.paired(records, "base", "new")
    assert [r["step"] for r in rows] == [10, 20]  # step 30: one run only
    assert rows[0]["diffs_pct"] == pytest.approx([1.0, -1.0]) and rows[0]["above"] == 1
    assert rows[1]["diffs_pct"] == pytest.approx([1.0, 1.5]) and rows[1]["seeds"] == 2
    low, high = rows[1]["ci95_pct"]
    assert low < 1.25 < high and high - 1.25 == pytest.approx(1.25 - low)
    assert rows[1]["base"] == pytest.approx(1.5)


def test_verdict_reads_the_last_pass_interval_against_the_margin():
    pv = benchmark_script("paired_val_loss")
    assert pv.verdict([{"step": 9, "ci95_pct": [-0.3, 0.2]}], 0.25) == (
        "no worse within 0.25% at step 9 (95% interval -0.300% to +0.200%)")
    rows = [{"step": 9, "ci95_pct": [-0.3, 0.2]}, {"step": 10, "ci95_pct": [-0.1, 0.3]}]
    assert pv.verdict(rows, 0.25).startswith("not shown no worse within 0.25% at step 10")
    assert pv.verdict([{"step": 1}], 0.25) == "too few paired seeds for an interval"


def test_runs_each_code_per_seed_alternating_and_resumes(tmp_path, capsys):
    pv = benchmark_script("paired_val_loss")
    codes = {}
    for tag, shift in (("base", "0.0"), ("new", "0.001")):
        code = tmp_path / tag
        (code / "src").mkdir(parents=True)
        (code / "src" / "run.py").write_text(STUB)
        (code / "SHIFT").write_text(shift)
        (code / "COMMIT").write_text(f"commit-{tag}\n")
        codes[tag] = code
    argv = ["--code", f"base={codes['base']}", "--code", f"new={codes['new']}", "--seeds", "0", "1", "2",
            "--root", str(tmp_path / "outputs"), "--out", str(tmp_path / "out"), "--", "train.max_steps=7"]
    summary = pv.main(argv)
    records = [json.loads(line) for line in (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    assert [(r["tag"], r["seed"]) for r in records] == pv.run_order(["base", "new"], [0, 1, 2]) == [
        ("base", 0), ("new", 0), ("new", 1), ("base", 1), ("base", 2), ("new", 2)]
    assert records[0]["commit"] == "commit-base" and records[0]["overrides"] == ["train.max_steps=7"]
    assert (codes["base"] / "calls.txt").read_text().splitlines() == ["0 commit-base 7", "1 commit-base 7",
                                                                      "2 commit-base 7"]
    last = summary["rows"][-1]
    assert last["step"] == 20 and last["above"] == 3
    assert last["diffs_pct"] == pytest.approx([0.1] * 3) and last["new"] == pytest.approx(1.5 * 1.001)
    assert summary["verdict"].startswith("no worse within 0.25% at step 20")
    assert summary["controls"] == {"pairs_checked": 3, "features_differ": {}, "params_differ": {}}
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["verdict"] == summary["verdict"]

    pv.main(argv)  # resumed: every pair is recorded, nothing runs again
    assert len((codes["new"] / "calls.txt").read_text().splitlines()) == 3
    again = pv.main(["--out", str(tmp_path / "out"), "--summary-only"])
    assert again["rows"] == summary["rows"]


def test_a_job_without_history_is_an_error_naming_its_manifest(tmp_path):
    pv = benchmark_script("paired_val_loss")
    train = tmp_path / "train" / "k"
    (train / "draft").mkdir(parents=True)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps({"tags": {"draft_dir": str(train / "draft")}}))
    with pytest.raises(RuntimeError, match=r"k/manifest\.json: no validation history"):
        pv.read_history(tmp_path / "run")


def test_a_failed_job_names_its_log(tmp_path):
    pv = benchmark_script("paired_val_loss")
    code = tmp_path / "broken"
    (code / "src").mkdir(parents=True)
    (code / "src" / "run.py").write_text("raise SystemExit(3)\n")
    run_dir = tmp_path / "out" / "broken-seed0"
    run_dir.mkdir(parents=True)
    with pytest.raises(RuntimeError, match=r"exited 3; see .*broken-seed0\.log"):
        pv.run_one(code, 0, [], tmp_path / "outputs", run_dir)


def test_runs_made_elsewhere_are_added_from_their_manifests(tmp_path, capsys):
    pv = benchmark_script("paired_val_loss")
    argv = ["--out", str(tmp_path / "out"), "--summary-only"]
    for tag, seed, loss in (("base", 0, 2.0), ("new", 0, 2.01), ("base", 1, 3.0), ("new", 1, 2.97)):
        manifest = tmp_path / f"{tag}{seed}" / "manifest.json"
        manifest.parent.mkdir()
        manifest.write_text(json.dumps({"history": [{"step": 100, "val/loss": loss}]}))
        argv += ["--add", tag, str(seed), str(manifest)]
    summary = pv.main(argv)
    assert summary["first"] == "base" and summary["rows"][0]["diffs_pct"] == pytest.approx([0.5, -1.0])
    assert pv.main(argv[:7])["first"] == "base"  # base 0 re-added, in place: still the reference
    assert pv.main(["--out", str(tmp_path / "out"), "--reference", "new", "--summary-only"])["first"] == "new"
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(SystemExit):
        pv.main(["--out", str(tmp_path / "out"), "--add", "new", "2", str(empty), "--summary-only"])
    assert f"--add new 2 {empty}: {empty}: no validation history" in capsys.readouterr().err


def test_a_resumed_comparison_refuses_other_overrides_before_running(tmp_path, capsys):
    pv = benchmark_script("paired_val_loss")
    out = tmp_path / "out"
    out.mkdir()
    (out / "runs.jsonl").write_text(json.dumps({"tag": "base", "seed": 0, "overrides": ["train.max_steps=7"],
                                                "history": []}) + "\n")
    for tag in ("base", "new"):
        (tmp_path / tag / "src").mkdir(parents=True)
        (tmp_path / tag / "src" / "run.py").write_text("raise SystemExit('must not run')\n")
    codes = ["--code", f"base={tmp_path / 'base'}", "--code", f"new={tmp_path / 'new'}", "--root", str(tmp_path),
             "--out", str(out), "--"]
    with pytest.raises(SystemExit):
        pv.main(codes + ["train.max_steps=8"])
    assert "base seed 0 ran with ['train.max_steps=7'], not ['train.max_steps=8']" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the same job, another code folder
        pv.main(codes + ["train.max_steps=7"])
    assert f"base seed 0 ran None, not {tmp_path / 'base'}" in capsys.readouterr().err


def _job_files(folder, loss, features, **params):
    """A train manifest and a job's results.json, as the `small` job leaves them, for `--add`."""
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"history": [{"step": 100, "val/loss": loss}]}))
    (folder / "results.json").write_text(json.dumps({
        "params": {"train.lr": "0.001", "tracking.run_name": f"seed={params.get('train.seed')}", **params},
        "tags": {"fingerprint.extract": features, "git.commit": "c"}}))
    return [str(folder / "manifest.json"), str(folder / "results.json")]


def test_added_runs_with_their_jobs_show_what_else_a_pair_differs_in(tmp_path, capsys):
    pv = benchmark_script("paired_val_loss")
    argv = ["--out", str(tmp_path / "out"), "--summary-only"]
    for tag, seed, loss, warmup in (("base", 0, 2.0, "True"), ("new", 0, 2.01, "auto"),
                                    ("base", 1, 3.0, "True"), ("new", 1, 2.97, "auto")):
        argv += ["--add", tag, str(seed), *_job_files(tmp_path / f"{tag}{seed}", loss, "feat",
                                                      **{"train.seed": str(seed), "train.compile_warmup": warmup})]
    summary = pv.main(argv)
    assert summary["controls"] == {"pairs_checked": 2, "features_differ": {},
                                   "params_differ": {"train.compile_warmup": {0: ["True", "auto"],
                                                                              1: ["True", "auto"]}}}
    assert ("pairs' conditions, 2 checked: the same features; params differ beyond the seed in train.compile_warmup "
            "(seed 0: True against auto, seed 1: True against auto)") in capsys.readouterr().out
    assert summary["rows"][0]["diffs_pct"] == pytest.approx([0.5, -1.0])


def test_a_pair_on_different_features_is_refused(tmp_path, capsys):
    pv = benchmark_script("paired_val_loss")
    argv = ["--out", str(tmp_path / "out"), "--summary-only"]
    for tag, seed, features in (("base", 0, "aaa"), ("new", 0, "aaa"), ("base", 1, "aaa"), ("new", 1, "bbb")):
        argv += ["--add", tag, str(seed), *_job_files(tmp_path / f"{tag}{seed}", 2.0, features,
                                                      **{"train.seed": str(seed)})]
    with pytest.raises(SystemExit):
        pv.main(argv)
    assert "not one cause varied: the pairs of seeds 1 (aaa against bbb) trained on different features" in (
        capsys.readouterr().err)


def test_an_add_names_its_bad_arguments(tmp_path, capsys):
    pv = benchmark_script("paired_val_loss")
    manifest, _ = _job_files(tmp_path / "run", 2.0, "feat")
    not_a_job = tmp_path / "other.json"
    not_a_job.write_text("{}")
    for add, message in ((["base", "0"], "--add base 0: expected TAG SEED MANIFEST [RESULTS]"),
                         (["base", "0", manifest, str(not_a_job)],
                          f"{not_a_job}: not a job's results.json (missing, or no params)")):
        with pytest.raises(SystemExit):
            pv.main(["--out", str(tmp_path / "out"), "--summary-only", "--add", *add])
        assert message in capsys.readouterr().err

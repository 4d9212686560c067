"""Val/loss of two codes at equal tokens, paired by seed: is the second code's draft no worse than the first's?

A faster trainer must train no worse at equal tokens. One run of each code cannot say so: the same code and seed
ended 0.34% apart on two H200 machines. Here each code
trains the same features once per seed with the same job, one cause varied: the code. A seed fixes the draft's
initialisation and the batches' order, so a pair differs only by what the code computes differently, and the paired
differences (second - first, in % of the first) are tested across seeds: their mean with a 95% t interval, the
Wilcoxon signed-rank p (two-sided; with 5 pairs or fewer it cannot fall below 0.05), and how many seeds ended above.
"No worse within MARGIN%" holds when the interval's upper end lies below the margin at the last validation pass
that every run reached: a one-sided test at 97.5%.

Each run is the code's own `src/run.py` (its `src` first on PYTHONPATH, DRAFTLAB_GIT_COMMIT from the folder's
COMMIT file), as a subprocess with the overrides after `--`, `train.seed`, `paths.root` and its own Hydra run folder.
Stages already cached under `paths.root` (generate, extract) are reused by both codes when their code is the same.
The runs' results are appended to `OUT/runs.jsonl` (rewritten atomically); a run already there is not run again,
so a stopped comparison resumes. The seeds alternate which code runs first.

    python benchmarks/paired_val_loss.py --code base=/tmp/ab/base --code new=/tmp/ab/new --seeds 0 1 2 3 \\
        --root /tmp/ab/outputs --out benchmarks/results/x -- 'stages=[train]' train.dtype=bfloat16 train.max_steps=120
    python benchmarks/paired_val_loss.py --out benchmarks/results/x --summary-only
    python benchmarks/paired_val_loss.py --out X --add base 0 A/train/KEY/manifest.json --add new 0 B/... --summary-only

`--add TAG SEED MANIFEST [RESULTS]` records a run made elsewhere (e.g. the H200's `small` job) from its train
stage's manifest.json; a pair's two runs must come from one machine, but pairs may come from several. The reference
is the first `--code`, else `--reference`, else the code first recorded.

One cause varied is checked where a run's job results.json is known (the tool's own runs; RESULTS for an added one):
a pair whose runs trained on different features (the tags' fingerprint.extract) is an error, and every other param in
which a pair's runs differ, beyond the seed, is printed and kept in the summary (`controls`), for the reader to judge.

Prints a line per run, then a table per validation step and one JSON line, also written to OUT/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scipy import stats
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from draftlab.util import fsutil  # noqa: E402


def run_order(tags: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """(tag, seed) in the order to run: each seed's pair together, the first code first at even positions."""
    pairs = []
    for i, seed in enumerate(seeds):
        pairs += [(tag, seed) for tag in (tags if i % 2 == 0 else tags[::-1])]
    return pairs


def read_history(run_dir: Path) -> tuple[list[dict], dict, dict]:
    """The train stage's validation passes [{step, val/...}], the job's metrics and its `job_facts`, from the job's
    results.json (its tag draft_dir names the train stage's folder, whose manifest.json holds the history)."""
    results_file = run_dir / "results.json"
    results = fsutil.read_json(results_file)
    if results is None:
        raise RuntimeError(f"{results_file}: missing; the job did not finish (its run.log says why)")
    draft_dir = results.get("tags", {}).get("draft_dir")
    if draft_dir is None:
        raise RuntimeError(f"{results_file}: no draft_dir tag; did the job run the train stage?")
    return (manifest_history(Path(draft_dir).parent / "manifest.json"), results.get("metrics", {}),
            job_facts(results))


# params in which a pair's two runs differ by design: the seed, and the run's name, which names it
PAIR_PARAMS = ("train.seed", "tracking.run_name")


def job_facts(results: dict) -> dict:
    """What a job's results.json says of the run's conditions: its params and the features it trained on (the
    extract stage's fingerprint); {} for a job that records no params."""
    if "params" not in results:
        return {}
    return {"params": results["params"], "features": results.get("tags", {}).get("fingerprint.extract")}


def pair_controls(records: list[dict], first: str, second: str) -> dict:
    """For each seed that both codes ran and whose two runs' conditions are known: whether they trained on the same
    features, and the params (beyond PAIR_PARAMS) in which they differ."""
    facts = {(r["tag"], r["seed"]): r.get("facts") or {} for r in records}
    seeds = sorted(s for tag, s in facts if tag == first and facts[(first, s)] and facts.get((second, s)))
    controls = {"pairs_checked": len(seeds), "features_differ": {}, "params_differ": {}}
    for seed in seeds:
        a, b = facts[(first, seed)], facts[(second, seed)]
        if a["features"] != b["features"]:
            controls["features_differ"][seed] = [a["features"], b["features"]]
        for key in sorted(set(a["params"]) | set(b["params"])):
            pair = [a["params"].get(key), b["params"].get(key)]
            if key not in PAIR_PARAMS and pair[0] != pair[1]:
                controls["params_differ"].setdefault(key, {})[seed] = pair
    return controls


def manifest_history(manifest: Path) -> list[dict]:
    """A train stage's validation passes, from its manifest.json; an error naming the file when it has none."""
    history = fsutil.read_json(manifest, {}).get("history")
    if not history:
        raise RuntimeError(f"{manifest}: no validation history (missing, or the run validated nothing)")
    return history


def write_records(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def commit_of(code: Path) -> str | None:
    """The commit a code folder's COMMIT file names (None without one)."""
    return (code / "COMMIT").read_text().strip() if (code / "COMMIT").exists() else None


def run_one(code: Path, seed: int, overrides: list[str], root: Path, run_dir: Path) -> float:
    """One job of `code` with this seed; its wall seconds. Fails naming the run's log when the job fails."""
    env = dict(os.environ, PYTHONPATH=str(code / "src"))
    env.pop("DRAFTLAB_GIT_COMMIT", None)  # not this shell's: the folder's, or the job's own git state
    if (commit := commit_of(code)) is not None:
        env["DRAFTLAB_GIT_COMMIT"] = commit
    cmd = [sys.executable, str(code / "src" / "run.py"), *overrides, f"train.seed={seed}",
           f"paths.root={root}", f"hydra.run.dir={run_dir}"]
    start = time.perf_counter()
    with open(run_dir.with_suffix(".log"), "w") as log:
        rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"{code} seed {seed} exited {rc}; see {run_dir.with_suffix('.log')}")
    return time.perf_counter() - start


def paired(records: list[dict], first: str, second: str, key: str = "val/loss") -> list[dict]:
    """Per validation step that every seed of both codes reached: the paired relative differences of `key`
    (second - first, % of first) and their tests. The last row is the runs' last common pass."""
    runs = {(r["tag"], r["seed"]): {int(e["step"]): e[key] for e in r["history"] if key in e} for r in records}
    seeds = sorted({seed for tag, seed in runs if tag == first} & {seed for tag, seed in runs if tag == second})
    if not seeds:
        return []
    steps = sorted(set.intersection(*(set(runs[(tag, s)]) for s in seeds for tag in (first, second))))
    rows = []
    for step in steps:
        a = [runs[(first, s)][step] for s in seeds]
        b = [runs[(second, s)][step] for s in seeds]
        diffs = [100.0 * (y - x) / x for x, y in zip(a, b)]
        row = {"step": step, "seeds": len(seeds), first: statistics.fmean(a), second: statistics.fmean(b),
               "mean_diff_pct": statistics.fmean(diffs), "above": sum(d > 0 for d in diffs), "diffs_pct": diffs}
        if len(diffs) >= 2:
            sd = statistics.stdev(diffs)
            half = stats.t.ppf(0.975, len(diffs) - 1) * sd / len(diffs) ** 0.5
            row.update(ci95_pct=[row["mean_diff_pct"] - half, row["mean_diff_pct"] + half],
                       wilcoxon_p=float(stats.wilcoxon(diffs).pvalue) if any(diffs) else 1.0)
        rows.append(row)
    return rows


def verdict(rows: list[dict], margin_pct: float) -> str:
    """The last common pass's reading against the margin."""
    if not rows or "ci95_pct" not in rows[-1]:
        return "too few paired seeds for an interval"
    (low, high), step = rows[-1]["ci95_pct"], rows[-1]["step"]
    reading = f"at step {step} (95% interval {low:+.3f}% to {high:+.3f}%)"
    return f"{'no worse' if high < margin_pct else 'not shown no worse'} within {margin_pct}% {reading}"


def control_line(controls: dict) -> str:
    """What `pair_controls` found, in a line."""
    if not controls["pairs_checked"]:
        return "pairs' conditions: not known (no job results.json recorded)"
    differ = "; ".join(f"{key} ({', '.join(f'seed {s}: {a} against {b}' for s, (a, b) in list(seeds.items())[:2])}"
                       f"{', ...' if len(seeds) > 2 else ''})" for key, seeds in controls["params_differ"].items())
    return (f"pairs' conditions, {controls['pairs_checked']} checked: the same features; params differ beyond the "
            f"seed in {differ or 'nothing'}")


def table(rows: list[dict], first: str, second: str) -> str:
    lines = [f"{'step':>6} {first:>9} {second:>9} {'diff %':>8} {'95% interval':>19} {'above':>6} {'wilcoxon':>8}"]
    for r in rows:
        ci = "{:+.3f} .. {:+.3f}".format(*r["ci95_pct"]) if "ci95_pct" in r else "-"
        p = f"{r['wilcoxon_p']:.3f}" if "wilcoxon_p" in r else "-"
        lines.append(f"{r['step']:>6} {r[first]:>9.4f} {r[second]:>9.4f} {r['mean_diff_pct']:>+8.3f} {ci:>19} "
                     f"{r['above']:>3}/{r['seeds']:<2} {p:>8}")
    return "\n".join(lines)


def add_records(p: argparse.ArgumentParser, records: list[dict], adds: list[list[str]]) -> None:
    """`--add TAG SEED MANIFEST [RESULTS]`s into `records`; a run recorded before is replaced where it was, so that
    the order of first appearance still names the reference."""
    for add in adds:
        given = " ".join(add)
        if len(add) not in (3, 4):
            p.error(f"--add {given}: expected TAG SEED MANIFEST [RESULTS]")
        tag, seed, manifest = add[:3]
        if not seed.isdigit():
            p.error(f"--add {given}: SEED must be a whole number")
        try:
            record = {"tag": tag, "seed": int(seed), "code": manifest, "history": manifest_history(Path(manifest))}
            if len(add) == 4:
                results = fsutil.read_json(Path(add[3]))
                if results is None or "params" not in results:
                    raise RuntimeError(f"{add[3]}: not a job's results.json (missing, or no params)")
                record["facts"] = job_facts(results)
        except RuntimeError as err:
            p.error(f"--add {given}: {err}")
        same = [i for i, r in enumerate(records) if (r["tag"], r["seed"]) == (tag, int(seed))]
        if same:
            records[same[0]] = record
        else:
            records.append(record)


def check_resumable(p: argparse.ArgumentParser, records_file: Path, records: list[dict], codes: dict[str, str],
                    overrides: list[str]) -> None:
    """A resumed comparison runs the job and the code it began with."""
    for r in records:
        if r.get("overrides", overrides) != overrides:
            p.error(f"{records_file}: {r['tag']} seed {r['seed']} ran with {r['overrides']}, not {overrides}; "
                    "use another --out")
        if r["tag"] in codes and r.get("code") != codes[r["tag"]]:
            p.error(f"{records_file}: {r['tag']} seed {r['seed']} ran {r.get('code')}, not {codes[r['tag']]}; "
                    "use another --out")


def run_missing(records_file: Path, records: list[dict], codes: dict[str, str], seeds: list[int],
                overrides: list[str], root: Path, out: Path) -> None:
    """Each (code, seed) not yet in `records`, recorded as it ends."""
    done = {(r["tag"], r["seed"]) for r in records}
    todo = [run for run in run_order(list(codes), seeds) if run not in done]
    for tag, seed in (bar := tqdm(todo, desc="runs", unit="run")):
        bar.set_postfix_str(f"{tag} seed {seed}")
        code, run_dir = Path(codes[tag]).resolve(), (out / "runs" / f"{tag}-seed{seed}").resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        seconds = run_one(code, seed, overrides, root.resolve(), run_dir)
        history, metrics, facts = read_history(run_dir)
        records.append({"tag": tag, "seed": seed, "code": codes[tag], "seconds": round(seconds, 1),
                        "commit": commit_of(code), "overrides": overrides, "history": history, "metrics": metrics,
                        "facts": facts})
        write_records(records_file, records)
        tqdm.write(f"{tag} seed {seed}: {seconds:.0f} s, val/loss {history[-1].get('val/loss')} "
                   f"at step {history[-1]['step']}")


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--code", action="append", default=[], metavar="TAG=DIR",
                   help="a code folder (src/, conf/, COMMIT), twice: the reference first")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--root", type=Path, help="paths.root shared by every run (its cached stages are reused)")
    p.add_argument("--out", type=Path, required=True, help="the runs' folders, runs.jsonl and summary.json")
    p.add_argument("--margin", type=float, default=0.25, help="the no-worse margin, in % of val/loss")
    p.add_argument("--reference",
                   help="the code the other is compared with (default: the first --code, else the first recorded)")
    p.add_argument("--add", nargs="+", action="append", default=[], metavar="TAG SEED MANIFEST [RESULTS]",
                   help="record a run made elsewhere from its train stage's manifest.json (and its job's results.json,"
                        " to check what else the pair's runs differ in)")
    p.add_argument("--summary-only", action="store_true", help="summarise OUT/runs.jsonl, run nothing")
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    records_file = args.out / "runs.jsonl"
    lines = records_file.read_text().split("\n") if records_file.exists() else []
    records = [json.loads(line) for line in lines if line.strip()]
    if args.add:
        add_records(p, records, args.add)
        write_records(records_file, records)
    if any("=" not in spec for spec in args.code):
        p.error(f"--code {next(spec for spec in args.code if '=' not in spec)}: expected TAG=DIR")
    codes = dict(spec.split("=", 1) for spec in args.code)
    if not args.summary_only:
        if len(codes) != 2 or args.root is None:
            p.error("--code TAG=DIR twice (the reference first) and --root are needed to run")
        for tag, folder in codes.items():
            if not (Path(folder) / "src" / "run.py").exists():
                p.error(f"--code {tag}={folder}: no src/run.py there")
        check_resumable(p, records_file, records, codes, overrides)
        run_missing(records_file, records, codes, args.seeds, overrides, args.root, args.out)
    tags = list(codes) or list(dict.fromkeys(r["tag"] for r in records))
    if args.reference is not None:
        if args.reference not in tags:
            p.error(f"--reference {args.reference}: {records_file} holds no runs of it (it has {', '.join(tags)})")
        tags = [args.reference] + [tag for tag in tags if tag != args.reference]
    if len(tags) != 2:
        p.error(f"{records_file}: runs of {len(tags)} codes ({', '.join(tags)}); two are compared")
    controls = pair_controls(records, tags[0], tags[1])
    if controls["features_differ"]:
        p.error("not one cause varied: the pairs of seeds "
                + ", ".join(f"{s} ({a} against {b})" for s, (a, b) in controls["features_differ"].items())
                + " trained on different features (fingerprint.extract)")
    rows = paired(records, tags[0], tags[1])
    summary = {"first": tags[0], "second": tags[1], "margin_pct": args.margin, "verdict": verdict(rows, args.margin),
               "controls": controls, "rows": rows}
    print(control_line(controls))
    print(table(rows, tags[0], tags[1]))
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"} | {"last": rows[-1] if rows else None}))
    fsutil.atomic_write_json(args.out / "summary.json", summary)
    return summary


if __name__ == "__main__":
    main()

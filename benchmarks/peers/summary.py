"""The side-by-side table from benchmarks/peers results: per run and per round, then same-round ratios.

    python benchmarks/peers/summary.py RESULTS SPLIT_JSON [--shape NAME] [--peak-tflops TFLOPS]

Run folders are named r<round>-<trainer> (run.sh). Each round's numbers go to RESULTS/round-<k>/results.json; the
last line printed is one JSON object for `python -m draftlab benchmark` (median ratios over the rounds).

- tok/s (loop): the training split's tokens times the epochs (every trainer trains on them) over the training loop's
  seconds, evaluation and saves left out (timing.py); tok/cpu-s uses the loop's process CPU time instead.
- steady tok/s: the same tokens per step (training tokens / the run's optimizer steps) over a window of steps
  between two of timing.py's synchronised marks, from the first mark past `warm` of the steps (and past a
  profiled step) to the last, the time of evaluations and saves inside it taken out: compile, warm-up and the
  first batches' shapes stay outside.
- whole job: the command's wall seconds, start-up, data loading, compile, training and the final save included.
- peak GPU memory: torch.cuda.max_memory_allocated in the trainer's process; beside it nvidia-smi's largest
  memory.used over the run less its first sample (the caching allocator's reserve and the CUDA context included).
- val/loss: draftlab's evaluator on the same validation samples (val_loss.py's val.json). Round k trains with seed
  k - 1 (rounds.sh), so a trainer's val/loss range over the rounds is its seed noise; draftlab is as good as a peer
  when its median val/loss lies above the peer's by no more than the larger of the two ranges
  (`behind_on_quality` lists the pairs where it does not). `min_steady_ratio` is over dl-new's pairs where dl-new
  ran (other dl-<label> runs are references); `min_steady_ratio_as_good` is None where one of them is behind.
- MFU two ways: the FLOPs a training token needs x steady tok/s over the run's card's datasheet dense bf16 peak
  (`mfu`, the standard definition) and over its measured matmul rate (`mfu_measured`), both from
  draftlab.benchmarks.peaks keyed by the card the run recorded. The count (`required_flops`): the fc and step 0's
  keys and values at every position, everything else only where a prediction counts (the loss-mask share of the
  training tokens), and no gradient nobody needs: the fc's input (the features) and a frozen head's weight, so
  4 x those matmuls, not 6. draftlab's packed unroll computes about that; the peers compute every position, which
  this count does not credit.
  `mfu_every_position` (results.json) is benchmarks/train_throughput.py's count instead: every position, 6 x every
  matmul, a rate measure on one scale for all three that can pass 1 for a trainer skipping work. Documents are
  causal and separate, so attention uses the effective length sum(L^2) / sum(L), for which (L + 1) / 2 keys a query
  is exact.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: train_throughput
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
WARM = 0.2  # the share of a run's steps left out of the steady window


def steady_rate(marks: list, spans: list, steps: int, tokens: float, warm: float = WARM,
                skip_until: int = 0) -> dict | None:
    """Tokens a second between two marks [step, seconds] (see the module doc); None without two marks past the
    warm-up. `spans` [[start, end], ...] (seconds) are taken out where they fall inside the window."""
    first = max(math.ceil(warm * steps), skip_until)
    inside = [m for m in marks if m[0] >= first]
    if len(inside) < 2 or steps <= 0:
        return None
    (s0, t0), (s1, t1) = inside[0], inside[-1]
    excluded = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in spans)
    seconds = t1 - t0 - excluded
    window_tokens = (s1 - s0) * tokens / steps
    return {"tok_s": window_tokens / seconds, "steps": s1 - s0, "seconds": seconds, "first_step": s0}


def effective_seq(tokens: int, sq_tokens: int) -> float:
    """The sequence length whose causal attention costs what the documents' does: sum(L^2) / sum(L)."""
    return sq_tokens / tokens


def mfu(flops_per_token: float, tok_s: float, peak_tflops: float) -> float:
    return flops_per_token * tok_s / (peak_tflops * 1e12)


def peaks_for(gpu: str | None, datasheet: float | None = None) -> tuple[float | None, float | None]:
    """The run's card's datasheet dense bf16 peak and measured matmul rate (draftlab.benchmarks.peaks);
    `datasheet` (--peak-tflops) stands in for an untabled card's datasheet peak."""
    from draftlab.benchmarks.peaks import DATASHEET_TFLOPS, MEASURED_TFLOPS, card

    key = card(gpu)
    return datasheet or DATASHEET_TFLOPS.get(key), MEASURED_TFLOPS.get(key)


def _counts(split: dict, ttt_steps: int) -> tuple:
    """The split's draft config and benchmarks/train_throughput.py's (total, parts) count at the documents' length."""
    from train_throughput import flops_per_token

    from draftlab.model.draft import DraftModelConfig

    cfg = DraftModelConfig(**split["draft"])
    seq = effective_seq(split["train_tokens"], split["train_sq_tokens"])
    return (cfg, *flops_per_token(cfg, seq, ttt_steps))


def model_flops(split: dict, ttt_steps: int) -> float:
    """benchmarks/train_throughput.py's count: every position, 6 x every matmul."""
    return _counts(split, ttt_steps)[1]


def required_flops(split: dict, ttt_steps: int, head_trained: bool) -> float | None:
    """The FLOPs a training token needs (module docstring); None without the split's loss-token count."""
    if not split.get("train_loss_tokens"):
        return None
    from train_throughput import required_flops_per_token

    from draftlab.model.draft import DraftModelConfig

    cfg = DraftModelConfig(**split["draft"])
    seq = effective_seq(split["train_tokens"], split["train_sq_tokens"])
    return required_flops_per_token(cfg, seq, ttt_steps, split["train_loss_tokens"] / split["train_tokens"],
                                    head_trained)


def head_trained(text: str) -> bool:
    """Whether the run trained its draft head: SpecForge does, speculators freezes it, draftlab trains it unless
    run.sh's overrides (settings.txt's `text`) froze it."""
    trainer = text.split(maxsplit=1)[0] if text.strip() else ""
    if trainer == "speculators":
        return False
    frozen = re.findall(r"train\.freeze_lm_head=(\w+)", text)
    return trainer != "draftlab" or not frozen or frozen[-1].lower() != "true"


def smi_peak_gb(path: Path) -> float | None:
    values = [float(x) for x in re.findall(r"^\s*(\d+(?:\.\d+)?)\s*$", path.read_text(), re.M)] if path.exists() else []
    return (max(values) - values[0]) / 1024 if values else None


def load_average(path: Path) -> str:
    """The 1-minute load average before / after the run (load.txt: /proc/loadavg twice)."""
    lines = path.read_text().splitlines() if path.exists() else []
    return " / ".join(line.split()[0] for line in lines) or "?"


def read_settings(text: str) -> dict[str, int]:
    """The integer settings run.sh wrote to settings.txt (ttt, epochs, seed, ...), the first of each name."""
    found = re.findall(r"(?:^|\s)(\w+)=(\d+)(?=\s|$)", text)
    return {key: int(value) for key, value in reversed(found)}


def load_run(folder: Path, split: dict) -> dict:
    path = folder / "settings.txt"
    text = path.read_text() if path.exists() else ""
    settings = read_settings(text)
    tokens = split["train_tokens"] * settings.get("epochs", 1)  # what the whole run trained on
    t = json.loads((folder / "timing.json").read_text())
    run = {"steps": t.get("steps", 0), "tok_s_loop": tokens / t["train_s"] if t["train_s"] else None,
           "tok_cpu_s": tokens / t["train_cpu_s"] if t["train_cpu_s"] else None, "loop_s": t["train_s"],
           "peak_alloc_gb": t.get("peak_alloc_gb"), "gpu": t.get("gpu"), "smi_peak_gb": smi_peak_gb(folder / "smi.txt"),
           "load": load_average(folder / "load.txt"), "ttt": settings.get("ttt"),
           "head_trained": head_trained(text)}
    profiled = t.get("profile_step") or 0  # the profiler's start and stop slow the steps around it
    steady = steady_rate(t.get("marks", []), t.get("inner_spans", []), run["steps"], tokens,
                         skip_until=profiled + 2 if profiled else 0)
    run["steady"] = steady
    run["tok_s_steady"] = steady["tok_s"] if steady else None
    wall = folder / "wall.txt"
    run["whole_job_s"] = float(wall.read_text()) if wall.exists() else None
    val = folder / "val.json"
    run["val"] = {k: v for k, v in json.loads(val.read_text()).items() if k.startswith("val/")} if val.exists() else {}
    run["val_loss"] = run["val"].get("val/loss")
    return run


def failed_run(folder: Path) -> dict:
    """A run that exited non-zero or left no timing: its exit code and its log's last line, so it is seen."""
    rc = (folder / "rc").read_text().strip() if (folder / "rc").exists() else "?"
    log = folder / "log.txt"
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [line.strip(" │╰╯─") for line in text.splitlines()]  # rich's traceback boxes
    errors = [line for line in lines if re.match(r"\w+(Error|Exception)\b", line)]
    return {"failed": True, "rc": rc, "error": (errors or [line for line in lines if line] or [""])[-1][:200]}


def load_rounds(results: Path, split: dict) -> dict[int, dict[str, dict]]:
    rounds: dict[int, dict[str, dict]] = defaultdict(dict)
    for folder in sorted(results.glob("r*-*")):
        match = re.fullmatch(r"r(\d+)-(.+)", folder.name)
        if not match:
            continue
        rc = folder / "rc"
        ok = (folder / "timing.json").exists() and rc.exists() and rc.read_text().strip() == "0"
        rounds[int(match[1])][match[2]] = load_run(folder, split) if ok else failed_run(folder)
    return rounds


def pairs(names) -> list[tuple[str, str]]:
    """Every draftlab run (dl-*) against every peer among `names`, sorted."""
    names = sorted(names)
    return [(d, p) for d in names if d.startswith("dl-") for p in names if not p.startswith("dl-")]


def pairs_missing(rounds: dict[int, dict[str, dict]], steady: dict[str, float]) -> list[str]:
    """draftlab/peer pairs with no steady ratio in any round: a peer that never ran must not pass the goal."""
    names = {n for runs in rounds.values() for n in runs}
    return [f"{d}/{p}" for d, p in pairs(names) if f"{d}/{p}" not in steady]


def ratios(runs: dict[str, dict]) -> dict[str, dict]:
    """draftlab (dl-*) against each peer within one round: rates as dl / peer, whole job as peer / dl (above 1:
    draftlab faster), val/loss as the % draftlab's lies above the peer's (negative: better)."""
    out = {}
    for d, p in pairs(n for n, run in runs.items() if not run.get("failed")):
        a, b = runs[d], runs[p]
        pair = {}
        for key in ("tok_s_loop", "tok_s_steady"):
            if a.get(key) and b.get(key):
                pair[key] = a[key] / b[key]
        if a.get("whole_job_s") and b.get("whole_job_s"):
            pair["whole_job"] = b["whole_job_s"] / a["whole_job_s"]
        if a.get("val_loss") is not None and b.get("val_loss"):
            pair["val_loss_diff_pct"] = 100 * (a["val_loss"] - b["val_loss"]) / b["val_loss"]
        out[f"{d}/{p}"] = pair
    return out


def medians(rounds: dict[int, dict[str, dict]]) -> dict[str, dict[str, float]]:
    collected: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for runs in rounds.values():
        for pair, values in ratios(runs).items():
            for key, value in values.items():
                collected[key][pair].append(value)
    return {key: {pair: round(statistics.median(v), 4) for pair, v in by_pair.items()}
            for key, by_pair in collected.items()}


def quality(rounds: dict[int, dict[str, dict]]) -> dict[str, dict[str, float]]:
    """Per draftlab/peer pair: the median val/loss % draftlab lies above the peer (`medians`' diff is a median of
    per-round diffs; this one compares the medians) and the seed noise, the larger of the two val/loss ranges over
    the rounds, in % of the peer's median."""
    losses: dict[str, list[float]] = defaultdict(list)
    for runs in rounds.values():
        for name, run in runs.items():
            if run.get("val_loss") is not None:
                losses[name].append(run["val_loss"])
    out = {}
    for d, p in pairs(losses):
        base = statistics.median(losses[p])
        spread = max(max(v) - min(v) for v in (losses[d], losses[p]))
        out[f"{d}/{p}"] = {"above_pct": 100 * (statistics.median(losses[d]) - base) / base,
                           "noise_pct": 100 * spread / base}
    return out


def fmt(x, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("split", type=Path)
    ap.add_argument("--shape", default=None, help="a name for these results (smollm2, llama8b)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="datasheet peak for a card benchmarks/peaks.py lacks")
    args = ap.parse_args()
    split = json.loads(args.split.read_text())
    rounds = load_rounds(args.results, split)
    flops = {}
    print(f"{args.shape or ''} {split['n_train']} train samples, {split['train_tokens']} tokens\n")
    print("| round | trainer | steady tok/s | MFU (datasheet) | MFU (measured) | GFLOP/token required / every position "
          "| loop tok/s | whole job s | peak alloc GB | nvidia-smi GB "
          "| val/loss | val acc_0 | load before/after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r, runs in sorted(rounds.items()):
        for name, x in sorted(runs.items()):
            if x.get("failed"):
                print(f"| {r} | {name} | failed, rc {x['rc']}: {x['error'].replace('|', '/')} |" + " |" * 10)
                continue
            key = (x["ttt"] or 7, x.get("head_trained", True))
            if key not in flops:  # both counts, once per TTT length and head mode
                flops[key] = model_flops(split, key[0]), required_flops(split, *key)
            every, need = flops[key]
            x["gflop_per_token"] = every / 1e9
            x["required_gflop_per_token"] = need / 1e9 if need else None
            steady = x["tok_s_steady"]
            sheet, measured = peaks_for(x.get("gpu"), args.peak_tflops)
            x["peak_tflops"], x["measured_tflops"] = sheet, measured
            x["mfu"] = mfu(need, steady, sheet) if steady and need and sheet else None
            x["mfu_measured"] = mfu(need, steady, measured) if steady and need and measured else None
            x["mfu_every_position"] = mfu(every, steady, sheet) if steady and sheet else None
            print(f"| {r} | {name} | {fmt(steady)} | {fmt(x['mfu'], '.3f')} | {fmt(x['mfu_measured'], '.3f')} | "
                  f"{fmt(x['required_gflop_per_token'], '.2f')} / {fmt(x['gflop_per_token'], '.2f')} | "
                  f"{fmt(x['tok_s_loop'])} | "
                  f"{fmt(x['whole_job_s'], '.1f')} | {fmt(x['peak_alloc_gb'], '.2f')} | "
                  f"{fmt(x['smi_peak_gb'], '.2f')} | "
                  f"{fmt(x['val_loss'], '.4f')} | {fmt(x['val'].get('val/acc_0'), '.3f')} | {x['load']} |")
        folder = args.results / f"round-{r}"
        folder.mkdir(exist_ok=True)
        (folder / "results.json").write_text(json.dumps({"round": r, "shape": args.shape, "split": split,
                                                         "peak_tflops": args.peak_tflops, "runs": runs,
                                                         "ratios": ratios(runs)}, indent=1))
    result = medians(rounds)
    print("\nSame-round ratios (draftlab / peer; whole job: peer s / draftlab s; val/loss: % above), per round:")
    for r, runs in sorted(rounds.items()):
        for pair, values in ratios(runs).items():
            print(f"- round {r} {pair}: " + ", ".join(f"{k} {v:.3f}" for k, v in values.items()))
    steady = result.get("tok_s_steady", {})
    missing = pairs_missing(rounds, steady)
    failed = defaultdict(list)
    for r, runs in sorted(rounds.items()):
        for name, x in runs.items():
            if x.get("failed"):
                failed[name].append(r)
    judged = quality(rounds)
    behind = sorted(pair for pair, q in judged.items() if q["above_pct"] > q["noise_pct"])
    for pair, q in judged.items():
        print(f"- {pair} val/loss: median {q['above_pct']:+.3f}% against the peer's, seed noise {q['noise_pct']:.3f}%"
              + (" (behind)" if pair in behind else ""))
    if missing:
        print(f"\nNo steady ratio for {', '.join(missing)}: the goal is not met (failed runs: {dict(failed)})")
    # the goal is the tree under test's (dl-new) where it ran; other dl-<label> runs are references beside it
    goal = {pair: v for pair, v in steady.items() if pair.startswith("dl-new/")} or steady
    lowest = min(goal.values()) if goal and not missing else None
    summary = {"shape": args.shape, "rounds": len(rounds), "median_ratio": result.get("tok_s_loop", {}),
               "median_steady_ratio": steady, "median_whole_job_ratio": result.get("whole_job", {}),
               "median_val_loss_diff_pct": result.get("val_loss_diff_pct", {}), "failed_rounds": dict(failed),
               "val_loss_vs_noise_pct": {pair: {k: round(v, 4) for k, v in q.items()} for pair, q in judged.items()},
               "behind_on_quality": behind, "missing_pairs": missing, "min_steady_ratio": lowest}
    summary["min_steady_ratio_as_good"] = None if set(behind) & set(goal) else lowest
    print(json.dumps(summary))  # for python -m draftlab benchmark peers / peers_gpu


if __name__ == "__main__":
    main()

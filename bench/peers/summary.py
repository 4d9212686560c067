"""The side-by-side table from bench/peers results: tokens/s per run and same-round ratios.

    python3 bench/peers/summary.py RESULTS SPLIT_JSON      (results folders are named r<round>-<trainer>)

tokens/s = the training split's tokens (all three trainers train one epoch on the same samples) / `train_s`,
the training loop's time minus evaluation and saves (timing.py); `tok/cpu-s` uses the loop's process CPU time
instead, which the other jobs on a shared machine disturb less. Load = the 1-minute load average before/after.
"""

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def load_runs(results: Path, tokens: int) -> dict[int, dict[str, dict]]:
    rounds: dict[int, dict[str, dict]] = defaultdict(dict)
    for folder in sorted(results.glob("r*-*")):
        match = re.fullmatch(r"r(\d+)-(.+)", folder.name)
        timing = folder / "timing.json"
        if not match or not timing.exists() or (folder / "rc").read_text().strip() != "0":
            continue
        t = json.loads(timing.read_text())
        loads = re.findall(r"load average: ([\d.]+)", (folder / "load.txt").read_text())
        time_v = (folder / "time.txt").read_text()
        wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", time_v)
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", time_v)
        rounds[int(match[1])][match[2]] = {
            "tok_s": tokens / t["train_s"], "tok_cpu_s": tokens / t["train_cpu_s"], "train_s": t["train_s"],
            "load": "/".join(loads), "wall": wall[1] if wall else "?", "rss_gb": int(rss[1]) / 2**20 if rss else 0}
    return rounds


def main() -> None:
    results, split = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    tokens = split["train_tokens"]
    rounds = load_runs(results, tokens)
    print(f"{split['n_train']} train samples, {tokens} tokens; tokens/s = tokens / training-loop seconds\n")
    print("| round | trainer | tokens/s | tok/cpu-s | loop s | whole command | peak RSS GB | load 1-min before/after |")
    print("|---|---|---|---|---|---|---|---|")
    for r, runs in sorted(rounds.items()):
        for name, x in sorted(runs.items()):
            print(f"| {r} | {name} | {x['tok_s']:.0f} | {x['tok_cpu_s']:.0f} | {x['train_s']:.1f} | {x['wall']} | "
                  f"{x['rss_gb']:.2f} | {x['load']} |")
    drafts = sorted({n for runs in rounds.values() for n in runs if n.startswith("dl-")})
    peers = sorted({n for runs in rounds.values() for n in runs if not n.startswith("dl-")})
    print("\nSame-round ratios (tokens/s; by CPU time in brackets), per round, then the median:")
    medians = {}
    for d in drafts:
        for p in peers:
            pairs = [(runs[d], runs[p]) for runs in rounds.values() if d in runs and p in runs]
            if not pairs:
                continue
            wall = [a["tok_s"] / b["tok_s"] for a, b in pairs]
            cpu = [a["tok_cpu_s"] / b["tok_cpu_s"] for a, b in pairs]
            print(f"- {d} / {p}: " + ", ".join(f"{w:.2f} ({c:.2f})" for w, c in zip(wall, cpu))
                  + f"; median {statistics.median(wall):.2f} ({statistics.median(cpu):.2f})")
            medians[f"{d}/{p}"] = round(statistics.median(wall), 3)
    print(json.dumps({"median_ratio": medians}))  # for python -m draftlab benchmark peers


if __name__ == "__main__":
    main()

"""Each run's training rate between two validation passes, from its log's timestamps (runs.tgz unpacked into the
current folder): steady_rate.txt. Part 4 of issue 11 asks for 5x the issue's 80k tok/s, a train-stage rate on real
generated samples; these runs are such a stage on real samples, so their steady rate is the same measure.

    mkdir /tmp/s28 && tar -xzf runs.tgz -C /tmp/s28 && cd /tmp/s28 && python3 <this file> > steady_rate.txt

From the pass logged at step FIRST to the pass at step LAST: (LAST - FIRST) steps of tokens_per_step each, over the
seconds between the two log lines, with and without the passes in between (each pass's seconds as its line prints
them, to 0.1 s). tokens_per_step: the run's train/train_tokens (prompt and answer tokens of the training split) x
train/epochs_seen / train/steps, as the stage's own train/mean_tokens_per_s counts them. The span starts after the
first pass, so neither graph's load from the compile cache (step 1 and the pass at step 100) is in it; the epochs'
ends (checkpoints on a thread), log windows and waits for batches are, as in any stage.
"""
import datetime
import glob
import json
import re
import statistics

FIRST, LAST, STATED = 200, 1500, 80_000
PASS = re.compile(r"\[(\S+ \S+)\]\[draftlab\]\[INFO\] - train: step (\d+) val/loss .*, a ([\d.]+) s pass")

print(f"run            tokens/step  span_s  passes_s  tok/s_with_passes  tok/s_without  x_{STATED // 1000}k")
rates = {}
for folder in sorted(glob.glob("small_*")):
    metrics = json.load(open(folder + "/results.json"))["metrics"]
    per_step = metrics["train/train_tokens"] * metrics["train/epochs_seen"] / metrics["train/steps"]
    passes = {}
    for line in open(folder + "/log-small.txt"):
        if match := PASS.search(line):
            when = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            passes[int(match.group(2))] = (when, float(match.group(3)))
    span = passes[LAST][0] - passes[FIRST][0]
    in_passes = sum(seconds for step, (_, seconds) in passes.items() if FIRST < step <= LAST)
    tokens = (LAST - FIRST) * per_step
    rate = tokens / (span - in_passes)
    rates.setdefault(folder.split("_")[1], []).append(rate)
    print(f"{folder:14s} {per_step:11.0f} {span:7.2f} {in_passes:9.1f} {tokens / span:18.0f} {rate:14.0f}"
          f" {rate / STATED:6.2f}")
for tag, values in rates.items():
    median = statistics.median(values)
    print(f"{tag}: median {median:.0f} tok/s without the passes ({median / STATED:.2f}x the stated {STATED // 1000}k),"
          f" range {min(values):.0f}-{max(values):.0f} over {len(values)} runs")
print(f"new/base (medians): {statistics.median(rates['new']) / statistics.median(rates['base']):.3f}x")

"""The train stage's time in each run of runs.tgz (unpacked into the current folder): train_seconds.txt.

    mkdir /tmp/s28 && tar -xzf runs.tgz -C /tmp/s28 && cd /tmp/s28 && python3 <this file> > train_seconds.txt
"""
import glob
import json
import statistics

print("run            seed  train/seconds  compile_s  loop_less_loads_s  mean_tokens_per_s  last_window_tok_s"
      "  data_wait_frac(last window)  best/val_loss")
rows = {}
for d in sorted(glob.glob("small_*")):
    m = json.load(open(d + "/results.json"))["metrics"]
    rest = m["train/seconds"] - m["train/compile_s"]  # the loop without loading the two graphs
    tag, seed = d.split("_")[1:]
    rows.setdefault(tag, []).append(rest)
    print(f"{d:14s} {seed:>4s} {m['train/seconds']:14.2f} {m['train/compile_s']:10.2f} {rest:18.2f} "
          f"{m['train/mean_tokens_per_s']:18.0f} {m['train/tokens_per_s']:18.0f} {m['train/data_wait_frac']:28.3f} "
          f"{m['best/val_loss']:14.4f}")
for tag, v in rows.items():
    print(f"{tag}: median train/seconds - compile_s {statistics.median(v):.2f} s over {len(v)} runs")
print(f"base/new: {statistics.median(rows['base']) / statistics.median(rows['new']):.3f}x")

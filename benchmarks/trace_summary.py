"""What bounds a profiled training step: the GPU's busy time against the wall, each host thread's time, and the
busiest kernels, read from the Chrome trace that `benchmarks/trainer_speed.py --profile` writes.

    python benchmarks/trace_summary.py trainer_profile.trace.json.gz [--skip-last 1] [--against OTHER.trace.json.gz]

Steps are torch.profiler's `ProfilerStep#N` annotations. The GPU's busy time is the union of its kernels', copies'
and memsets' intervals within the steps (summing each op's device time counts overlaps twice, and the profiler's
own tables add copies into their callers). `--skip-last` leaves out the last steps (in the H200 profile of
2026-12-03 the last one held an epoch's end: a checkpoint copied to the host, 438 ms). A host thread's time is the
sum of its outermost ops; where the host threads' time fills the wall and the GPU's does not, launching is the bound,
not the kernels. `--against` adds the kernels whose time per step changed most from the other trace's to this one's
(two codes' profiles): a kernel is matched by its whole name without Inductor's trailing number, which a fused
kernel changes from one graph to the next, so a row can sum several kernels of one name.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def union_us(events: list[dict]) -> float:
    """Microseconds covered by at least one of the events' intervals."""
    total, start, end = 0.0, None, None
    for e in sorted(events, key=lambda e: e["ts"]):
        s, t = e["ts"], e["ts"] + e["dur"]
        if end is None or s > end:
            total += 0.0 if end is None else end - start
            start, end = s, t
        else:
            end = max(end, t)
    return total + (0.0 if end is None else end - start)


def outermost(events: list[dict]) -> list[dict]:
    """The events not nested in another of them (one thread's)."""
    out, end = [], float("-inf")
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def _steps(events: list[dict], category: str, skip_last: int) -> list[dict]:
    """The ProfilerStep spans of one category, in order, without the last `skip_last`."""
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep") and e.get("cat") == category),
                   key=lambda e: e["ts"])
    return steps[:len(steps) - skip_last] if skip_last else steps


def _window(events: list[dict], skip_last: int) -> tuple[list[dict], list[dict]]:
    """The kept steps' host spans, and the GPU's events of those steps."""
    steps = _steps(events, "user_annotation", skip_last)
    if not steps:
        raise SystemExit("no ProfilerStep annotations left in the trace")
    # the GPU runs behind the host: its work of those steps lies within the steps' GPU-side spans where the trace
    # has them, else (an approximation) within the host's
    on_gpu = _steps(events, "gpu_user_annotation", skip_last)
    spans = on_gpu if len(on_gpu) == len(steps) else steps
    lo, hi = spans[0]["ts"], spans[-1]["ts"] + spans[-1]["dur"]
    return steps, [e for e in events if e.get("cat") in GPU_CATEGORIES and lo <= e["ts"] < hi]


def _kernel_totals(gpu: list[dict]) -> dict[str, list]:
    """Each kernel's [launches, device us], by whole name: Inductor's fused kernels can share 100 characters."""
    totals = defaultdict(lambda: [0, 0.0])
    for e in gpu:
        if e["cat"] == "kernel":
            totals[e["name"]][0] += 1
            totals[e["name"]][1] += e["dur"]
    return totals


def kernel_ms(events: list[dict], skip_last: int = 1) -> dict[str, float]:
    """Each kernel's device ms per kept step, by its whole name."""
    steps, gpu = _window(events, skip_last)
    return {name: us / len(steps) / 1e3 for name, (_, us) in _kernel_totals(gpu).items()}


def summarize(events: list[dict], skip_last: int = 1, top: int = 12) -> dict:
    steps, gpu = _window(events, skip_last)
    lo, hi, n = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"], len(steps)
    by_category = defaultdict(float)
    for e in gpu:
        by_category[e["cat"]] += e["dur"]
    kernels = _kernel_totals(gpu)
    threads = defaultdict(list)
    for e in events:
        if e.get("cat") in HOST_CATEGORIES and lo <= e["ts"] < hi and not e["name"].startswith("ProfilerStep"):
            threads[e["tid"]].append(e)
    host = {}
    for tid, evs in threads.items():
        ops = defaultdict(float)
        for e in outermost(evs):
            ops[e["name"][:80]] += e["dur"]
        host[str(tid)] = {"busy_ms_per_step": round(sum(ops.values()) / n / 1e3, 3),
                          "top": {k: round(v / n / 1e3, 3) for k, v in sorted(ops.items(), key=lambda x: -x[1])[:6]}}
    wall = (hi - lo) / n / 1e3
    busy = union_us(gpu) / n / 1e3
    return {"steps": n, "wall_ms_per_step": round(wall, 3), "gpu_busy_ms_per_step": round(busy, 3),
            "gpu_busy_share": round(busy / wall, 3),
            "gpu_ms_per_step": {k: round(v / n / 1e3, 3) for k, v in by_category.items()},
            "kernels_per_step": round(sum(c for c, _ in kernels.values()) / n, 1),
            "host_threads": host,
            "top_kernels_ms_per_step": {k: round(t / n / 1e3, 3) for k, (c, t) in
                                        sorted(kernels.items(), key=lambda x: -x[1][1])[:top]}}


def kernel_changes(before: dict[str, float], after: dict[str, float], top: int = 12) -> list[dict]:
    """The kernels whose ms per step changed most from `before` to `after` (kernel_ms of two traces). A kernel is
    matched by its whole name without Inductor's trailing number, so one row sums every kernel of that name (a
    graph's copies of one fused kernel); a name over 100 characters is shown by its head and tail, where fused
    kernels that share a prefix differ."""
    def by_name(times: dict[str, float]) -> dict[str, float]:
        merged = defaultdict(float)
        for name, ms in times.items():
            merged[re.sub(r"_\d+$", "", name)] += ms
        return merged
    old, new = by_name(before), by_name(after)
    names = sorted(old.keys() | new.keys(), key=lambda k: (-abs(new.get(k, 0.0) - old.get(k, 0.0)), k))
    return [{"kernel": k if len(k) <= 100 else f"{k[:60]}...{k[-37:]}",
             "before_ms": round(old.get(k, 0.0), 3), "after_ms": round(new.get(k, 0.0), 3),
             "change_ms": round(new.get(k, 0.0) - old.get(k, 0.0), 3)} for k in names[:top]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--skip-last", type=int, default=1, help="last steps left out (e.g. one that saved a checkpoint)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--against", type=Path, help="another code's trace: the kernels whose time changed most")
    args = ap.parse_args()
    events = load(args.trace)
    summary = summarize(events, args.skip_last, args.top)
    if args.against:
        other = load(args.against)
        summary["kernel_changes_from_against"] = kernel_changes(kernel_ms(other, args.skip_last),
                                                                kernel_ms(events, args.skip_last), args.top)
        summary["against_gpu_ms_per_step"] = summarize(other, args.skip_last)["gpu_ms_per_step"]
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

"""The draft's serving settings chosen in SGLang: `bench.sglang_grid`, each (steps, topk, num_draft_tokens) one
server start, measured on the first set's prompts against the baseline server's answers to the same prompts. The
main bench's own setting (serve.*) is a grid point too, read from its answers to the same prompts.

Metrics under `bench/sglang/grid/s<steps>_k<topk>_n<ndt>/`: tau, tokens_per_s, speedup, cycle_ms (wall ms per
verify step, prefill included). The best setting by speed-up is `bench/sglang/grid_best/...` and its launch flags
go to `grid.json` and the log. The step costs come from the grid itself: for the chain settings (topk 1) the cycle
time is fitted as verify + steps x draft step, and the baseline server's ms per token is the target step; the
bound a chain setting can reach is then tau / (1 + steps x draft / target), as for the local engine
(serve/step_costs.py); a tree (topk > 1) drafts and verifies more tokens a step, so it gets no bound.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from draftlab.util.fsutil import atomic_write_json
from draftlab.sglang import requests
from draftlab.sglang.client import SGLangClient
from draftlab.sglang.launch import LaunchError, build_server_argv, spec_params

log = logging.getLogger("draftlab.sglang")
GRID = "bench/sglang/grid"


def settings(grid: list, key: str = "bench.sglang_grid") -> list[tuple[int, int, int]]:
    """Each entry [steps, topk] or [steps, topk, num_draft_tokens], validated as serve.* would be."""
    out = []
    for i, entry in enumerate(grid):
        values = list(entry) if isinstance(entry, (list, tuple)) or OmegaConf.is_list(entry) else None
        if values is None or len(values) not in (2, 3):
            raise LaunchError(f"{key}[{i}]: {entry!r} is not [steps, topk] or [steps, topk, num_draft_tokens]")
        values += [None] * (3 - len(values))
        try:
            out.append(spec_params({"num_steps": values[0], "topk": values[1], "num_draft_tokens": values[2]}))
        except LaunchError as err:
            raise LaunchError(f"{key}[{i}]: {err}") from None
    return out


def label(setting: tuple[int, int, int]) -> str:
    return "s{}_k{}_n{}".format(*setting)


def launch_flags(setting: tuple[int, int, int]) -> str:
    steps, topk, ndt = setting
    return (f"--speculative-algorithm EAGLE3 --speculative-num-steps {steps} --speculative-eagle-topk {topk} "
            f"--speculative-num-draft-tokens {ndt}")


def step_costs(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(verify_ms, draft_step_ms) fitted to (steps, cycle_ms) of chain settings; None without two step counts."""
    if len({k for k, _ in points}) < 2:
        return None
    k, ms = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    slope, intercept = np.polyfit(k, ms, 1)
    return float(intercept), float(slope)


def run_grid(serve: Any, bench: Any, target_path, draft: Path, prompts: list, base_rows: list[dict], out: Path,
             reporter, server_cmd: list[str] | None = None) -> dict[str, float]:
    """Each setting of bench.sglang_grid on the first `bench.grid_prompts` prompts (`serve`, `bench`: the serve.*
    and bench.* settings); `base_rows`: the same prompts' per-request rows of the main bench (their
    baseline_tokens and base_s are the baseline server's)."""
    from draftlab.sglang.bench import port_lock, server, with_command

    chosen = settings(bench.sglang_grid)
    count = min(bench.get("grid_prompts") or len(prompts), len(prompts))
    prompts, base_rows = prompts[:count], base_rows[:count]
    base_tokens = sum(r["baseline_tokens"] for r in base_rows)
    base_s = sum(r["base_s"] for r in base_rows)
    target_ms = 1000 * base_s / base_tokens
    client = SGLangClient(serve.host, serve.port)
    main = spec_params(serve)  # measured already by the main bench on these prompts: a grid point for free
    results = [_point(main, [{"completion_tokens": r["tokens"], "spec_verify_ct": r["verify_steps"],
                              "latency_s": r["spec_s"]} for r in base_rows], base_tokens / base_s)]
    for setting in (s for s in chosen if s != main):
        point = OmegaConf.merge(serve, {"num_steps": setting[0], "topk": setting[1],
                                        "num_draft_tokens": setting[2]})
        argv = with_command(build_server_argv(point, target_path, draft, decode_log_interval=1), server_cmd)
        name = label(setting)
        with port_lock(serve), server(argv, out, f"grid-{name}", serve, reporter, f"{GRID}/{name}/startup"):
            requests.warm(client, prompts)
            records = requests.run_prompts(client, prompts, bench)
        results.append({**_point(setting, records, base_tokens / base_s), "records": records})
        log.info("sglang grid %s: tau %.3f, speed-up %.3fx", name, results[-1]["tau"], results[-1]["speedup"])
        atomic_write_json(out / "grid.json", {"target_ms": target_ms, "prompts": count, "settings": results})
    return grid_metrics(results, target_ms, count, out)


def _point(setting: tuple[int, int, int], records: list[dict], base_rate: float) -> dict:
    tokens = sum(r["completion_tokens"] for r in records)
    verify = sum(r["spec_verify_ct"] or 0 for r in records)
    seconds = sum(r["latency_s"] for r in records)
    return {"setting": list(setting), "tau": tokens / verify if verify else float("nan"),
            "tokens_per_s": tokens / seconds, "speedup": (tokens / seconds) / base_rate,
            "cycle_ms": 1000 * seconds / verify if verify else float("nan")}


def grid_metrics(results: list[dict], target_ms: float, count: int, out: Path) -> dict[str, float]:
    m: dict[str, float] = {f"{GRID}/prompts": float(count), f"{GRID}/target_ms": target_ms}
    fit = step_costs([(r["setting"][0], r["cycle_ms"]) for r in results if r["setting"][1] == 1])
    if fit is not None:
        m[f"{GRID}/verify_ms"], m[f"{GRID}/draft_step_ms"] = fit
    for r in results:
        p = f"{GRID}/{label(tuple(r['setting']))}"
        for key in ("tau", "tokens_per_s", "speedup", "cycle_ms"):
            m[f"{p}/{key}"] = float(r[key])
        if fit is not None and r["setting"][1] == 1:  # a tree's draft and verify steps cost what no chain shows
            r["bound"] = r["tau"] / (1 + r["setting"][0] * fit[1] / target_ms)
            m[f"{p}/speedup_bound"] = r["bound"]
            m[f"{p}/speedup_of_bound"] = r["speedup"] / r["bound"]
    best = max(results, key=lambda r: r["speedup"])
    for key, value in zip(("steps", "topk", "num_draft_tokens"), best["setting"]):
        m[f"bench/sglang/grid_best/{key}"] = float(value)
    m["bench/sglang/grid_best/tau"], m["bench/sglang/grid_best/speedup"] = best["tau"], best["speedup"]
    if "bound" in best:
        m["bench/sglang/grid_best/speedup_bound"] = best["bound"]
        m["bench/sglang/grid_best/speedup_of_bound"] = best["speedup"] / best["bound"]
    flags = launch_flags(tuple(best["setting"]))
    atomic_write_json(out / "grid.json", {"target_ms": target_ms, "prompts": count, "step_costs_ms": fit,
                                          "best": best["setting"], "best_flags": flags, "settings": results})
    log.info("sglang grid: best %s, speed-up %.3fx at tau %.3f; launch with %s", label(tuple(best["setting"])),
             best["speedup"], best["tau"], flags)
    return m

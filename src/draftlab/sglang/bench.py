"""Benchmark a draft in SGLang (serve.backend=sglang): acceptance and throughput, baseline without speculation.

Order: check-draft (a failing draft is never launched: a 15-minute start that serves at tau ~1 is the
failure this exists to prevent), speculative server -> every set's prompts one at a time, then each batch size
above 1 as that many concurrent requests -> stop, baseline server -> the same -> stop. Metric names are the local
engine's: per set `bench/<set>/tau` (+ _lo/_hi), `speedup` (+ _lo/_hi), `tokens_per_s`, `baseline_tokens_per_s`,
`prompts`, `server_accept_length`; the first set also as bench/tau, bench/tokens_per_s,
bench/baseline_tokens_per_s, bench/speedup; `bench/bs<B>/...` per batch size. SGLang's responses carry no accept
count per draft position, so `accept_rate_<j>` is the local engine's only. (The bench stage adds tau_ratio.)

tau: SGLang's per-request meta_info gives completion_tokens and spec_verify_ct; bench/<set>/tau pools them
(sum of tokens / sum of verify steps), so long answers weigh more, as in the server's own average. The server's
own count, /server_info internal_states[0].avg_spec_accept_length (which only advances every decode-log interval;
we launch with --decode-log-interval 1), is read after each set, its counters reset (/flush_cache) before it, and
cross-checked. meta_info counts the prefill's first token, so it reads slightly high on short answers.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from draftlab.fsutil import atomic_write_json, atomic_write_text, file_lock
from draftlab.sglang.check import check_draft
from draftlab.sglang.client import SGLangClient, server_accept_length
from draftlab.sglang.formats import convert, detect_format
from draftlab.sglang.launch import build_baseline_argv, build_server_argv, spec_params
from draftlab.sglang.monitor import SGLangServer
from draftlab.serve.intervals import set_metrics

log = logging.getLogger("draftlab.sglang")
CROSS_CHECK_TOLERANCE = 0.15  # relative; meta_info includes the prefill token, the server average does not


class DraftCheckError(RuntimeError):
    """check-draft failed; the draft was not launched."""


def prepare_draft(draft_dir: Path, out: Path, target_path, rules: str, extract_manifest=None) -> Path:
    """A speculators-format draft is converted to SGLang format; then check-draft must pass."""
    draft_dir = Path(draft_dir)
    if detect_format(draft_dir) == "speculators":
        draft_dir = convert(draft_dir, out / "draft-sglang", "sglang")
        log.info("converted the speculators-format draft to SGLang format in %s", draft_dir)
    report = check_draft(draft_dir, target_path, rules, extract_manifest)
    atomic_write_text(out / "check-draft.txt", report.summary() + "\n")
    if not report.ok:
        raise DraftCheckError("check-draft failed, SGLang not launched:\n" + report.summary())
    for finding in report.findings:
        log.warning("check-draft: %s", finding)
    return draft_dir


def _record(i: int, out: dict) -> dict:
    meta = out.get("meta_info", {})
    tokens = int(meta.get("completion_tokens", len(out.get("output_ids", []))))
    verify = meta.get("spec_verify_ct")
    return {"prompt": i, "completion_tokens": tokens, "spec_verify_ct": verify,
            "tau": tokens / verify if verify else None, "latency_s": out["latency_s"]}


def _run_prompts(client: SGLangClient, prompts: list, bench: Any) -> list[dict]:
    return [_record(i, client.generate(p, bench.max_new_tokens, bench.temperature)) for i, p in enumerate(prompts)]


def _run_batches(client: SGLangClient, prompts: list, size: int, bench: Any) -> tuple[int, float]:
    """(completion tokens, wall seconds) of the prompts sent `size` at a time, concurrently, batches cycled full
    as the local engine's are (serve/batch_bench.py)."""
    from draftlab.serve.batch_bench import filled_batches

    tokens, seconds = 0, 0.0
    with ThreadPoolExecutor(max_workers=size) as pool:
        for batch in filled_batches(prompts, size):
            t0 = time.perf_counter()
            outs = list(pool.map(lambda p: client.generate(p, bench.max_new_tokens, bench.temperature), batch))
            seconds += time.perf_counter() - t0
            tokens += sum(_record(0, o)["completion_tokens"] for o in outs)
    return tokens, seconds


def _serve_sets(client: SGLangClient, sets: dict[str, list], sizes: list[int], bench: Any, server_tau: bool):
    """Every set's records, the server's own accept length per set (when speculative), and per batch size above 1
    its (tokens, seconds) on the first set's prompts."""
    records, server, batches = {}, {}, {}
    for name, prompts in sets.items():
        if server_tau:
            client.flush_cache()  # the server's acceptance counters count this set alone
        records[name] = _run_prompts(client, prompts, bench)
        if server_tau:
            server[name] = client.server_info()
    first = next(iter(sets.values()))
    for size in (b for b in sizes if b > 1):
        batches[size] = _run_batches(client, first, size, bench)
    return records, server, batches


def _server(argv, out: Path, name: str, serve: Any, reporter, prefix: str) -> SGLangServer:
    return SGLangServer(argv, out / f"{name}.log", host=serve.host, port=serve.port,
                        timeout_s=serve.startup_timeout_s, reporter=reporter, name=f"sglang-{name}",
                        metric_prefix=prefix)


def _with_command(argv: list[str], server_cmd: list[str] | None) -> list[str]:
    """Replaces `python -m sglang.launch_server` (the first three items) by server_cmd, for tests."""
    return argv if server_cmd is None else list(server_cmd) + argv[3:]


def _warm(client: SGLangClient, prompts: list) -> None:
    client.generate(prompts[0], 8)  # first-request JIT/allocations stay out of the timed runs
    client.flush_cache()  # resets the server's acceptance counters (404 on servers without it)


def run_sglang_bench(cfg: Any, target_path, draft_dir, sets: dict[str, list], out: Path, reporter,
                     extract_manifest=None, server_cmd: list[str] | None = None) -> tuple[dict, list[dict]]:
    """Launches SGLang with the draft and without, sends every set's prompts (`sets`: name -> prompts, ids or
    text), returns (the bench/* metrics, the per-prompt rows)."""
    serve, bench, out = cfg.serve, cfg.bench, Path(out)
    if not sets or not all(sets.values()):
        raise ValueError("prompts: every bench set needs at least one prompt")
    out.mkdir(parents=True, exist_ok=True)
    draft = prepare_draft(draft_dir, out, target_path, serve.sglang_rules, extract_manifest)
    steps, topk, ndt = spec_params(serve)
    spec_argv = _with_command(build_server_argv(serve, target_path, draft, decode_log_interval=1), server_cmd)
    base_argv = _with_command(build_baseline_argv(serve, target_path), server_cmd)
    client = SGLangClient(serve.host, serve.port)
    sizes = list(bench.batch_sizes)
    first = next(iter(sets.values()))
    # Jobs of a sweep share serve.port, and SGLang binds it only minutes into its start: without this
    # machine-wide lock a second job's health check could be answered by the first job's server.
    with file_lock(Path(tempfile.gettempdir()) / f"draftlab-sglang-port-{serve.port}.lock"):
        with _server(spec_argv, out, "speculative", serve, reporter, "bench/startup"):
            _warm(client, first)
            spec_records, infos, spec_batches = _serve_sets(client, sets, sizes, bench, server_tau=True)
        with _server(base_argv, out, "baseline", serve, reporter, "bench/baseline_startup"):
            _warm(client, first)
            base_records, _, base_batches = _serve_sets(client, sets, sizes, bench, server_tau=False)

    metrics, rows, warnings = {}, [], []
    for name in sets:
        set_rows = _rows(name, spec_records[name], base_records[name])
        if sum(r["verify_steps"] for r in set_rows) == 0:
            raise RuntimeError("SGLang returned no spec_verify_ct: the server did not run speculative decoding")
        rows += set_rows
        metrics.update(set_metrics(f"bench/{name}", set_rows, steps, bench.seed))
        server_tau = server_accept_length(infos[name])
        if server_tau is not None:
            metrics[f"bench/{name}/server_accept_length"] = server_tau
        warnings += [f"{name}: {w}" for w in _cross_check(metrics[f"bench/{name}/tau"], infos[name],
                                                           (steps, topk, ndt))]
    p = f"bench/{next(iter(sets))}"
    for key in ("tau", "tokens_per_s", "baseline_tokens_per_s", "speedup", "server_accept_length"):
        if f"{p}/{key}" in metrics:
            metrics[f"bench/{key}"] = metrics[f"{p}/{key}"]
    metrics.update(_batch_metrics(metrics, p, spec_batches, base_batches))
    if metrics["bench/tau"] <= bench.tau_fail:
        warnings.append(f"bench/tau {metrics['bench/tau']:.3f} <= bench.tau_fail {bench.tau_fail}: the draft "
                        "contributes nothing in SGLang (dropped weights, wrong layers or algorithm?)")
    for warning in warnings:
        log.warning("sglang bench: %s", warning)
    result_path = out / "sglang_bench.json"
    info = infos[next(iter(sets))]
    atomic_write_json(result_path, {
        "metrics": metrics, "warnings": warnings, "spec_argv": spec_argv, "baseline_argv": base_argv,
        "draft_dir": str(draft), "speculative": spec_records, "baseline": base_records,
        "server_info": {k: info.get(k) for k in ("speculative_algorithm", "speculative_num_steps",
                                                   "speculative_eagle_topk", "speculative_num_draft_tokens",
                                                   "version", "internal_states")},
    })
    reporter.metrics(metrics)
    reporter.artifact(result_path)
    return metrics, rows


def _rows(name: str, spec: list[dict], base: list[dict]) -> list[dict]:
    """The per-prompt table's rows (serve/intervals.py's keys); no per-position accept counts from SGLang."""
    return [{"set": name, "prompt": s["prompt"], "tokens": s["completion_tokens"],
             "verify_steps": s["spec_verify_ct"] or 0, "tau": s["tau"], "spec_s": s["latency_s"],
             "baseline_tokens": b["completion_tokens"], "base_s": b["latency_s"]} for s, b in zip(spec, base)]


def _batch_metrics(metrics: dict, first: str, spec: dict, base: dict) -> dict[str, float]:
    """bench/bs<B>/...: batch size 1 is the first set's sequential run, larger ones its concurrent batches."""
    m = {"bench/bs1/tokens_per_s": metrics[f"{first}/tokens_per_s"],
         "bench/bs1/baseline_tokens_per_s": metrics[f"{first}/baseline_tokens_per_s"],
         "bench/bs1/speedup": metrics[f"{first}/speedup"]}
    for size, (tokens, seconds) in spec.items():
        base_tokens, base_seconds = base[size]
        m[f"bench/bs{size}/tokens_per_s"] = tokens / seconds if seconds > 0 else float("nan")
        m[f"bench/bs{size}/baseline_tokens_per_s"] = base_tokens / base_seconds if base_seconds > 0 else float("nan")
        m[f"bench/bs{size}/speedup"] = m[f"bench/bs{size}/tokens_per_s"] / m[f"bench/bs{size}/baseline_tokens_per_s"]
    return m


def _cross_check(tau: float, info: dict, wanted: tuple[int, int, int]) -> list[str]:
    warnings = []
    resolved = tuple(info.get(k) for k in ("speculative_num_steps", "speculative_eagle_topk",
                                            "speculative_num_draft_tokens"))
    if all(v is not None for v in resolved) and resolved != wanted:
        warnings.append(f"SGLang resolved steps/topk/ndt to {resolved}, not the requested {wanted}")
    algorithm = info.get("speculative_algorithm")
    if algorithm is not None and str(algorithm).upper() != "EAGLE3":
        warnings.append(f"SGLang runs speculative_algorithm={algorithm}, not EAGLE3")
    server_tau = server_accept_length(info)
    if server_tau is None:
        warnings.append("/server_info has no avg_spec_accept_length (fewer decode steps than the log interval)")
    elif not math.isclose(server_tau, tau, rel_tol=CROSS_CHECK_TOLERANCE):
        warnings.append(f"per-request tau {tau:.3f} and the server's avg_spec_accept_length "
                        f"{server_tau:.3f} differ by more than {CROSS_CHECK_TOLERANCE:.0%}")
    return warnings

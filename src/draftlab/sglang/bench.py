"""Benchmark a draft in SGLang (serve.backend=sglang): acceptance and throughput, baseline without speculation.

Order: check-draft (a failing draft is never launched: a 15-minute start that serves at tau ~1 is the
failure this exists to prevent), speculative server -> held-out prompts one at a time -> stop, baseline
server -> same prompts -> stop. Metric names are the local engine's: bench/tau, bench/tokens_per_s,
bench/baseline_tokens_per_s, bench/speedup (the bench stage owner adds tau_ratio).

tau: SGLang's per-request meta_info gives completion_tokens and spec_verify_ct; bench/tau pools them
(sum of tokens / sum of verify steps), so long answers weigh more, as in the server's own average. It is
cross-checked against /server_info internal_states[0].avg_spec_accept_length (which only advances every
decode-log interval; we launch with --decode-log-interval 1). meta_info counts the prefill's first token,
so it reads slightly high on short answers.
"""

from __future__ import annotations

import logging
import math
import tempfile
from pathlib import Path
from typing import Any

from draftlab.fsutil import atomic_write_json, atomic_write_text, file_lock
from draftlab.sglang.check import check_draft
from draftlab.sglang.client import SGLangClient, server_accept_length
from draftlab.sglang.formats import convert, detect_format
from draftlab.sglang.launch import build_baseline_argv, build_server_argv, spec_params
from draftlab.sglang.monitor import SGLangServer

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


def _run_prompts(client: SGLangClient, prompts: list, bench: Any) -> list[dict]:
    records = []
    for i, prompt in enumerate(prompts):
        out = client.generate(prompt, bench.max_new_tokens, bench.temperature)
        meta = out.get("meta_info", {})
        tokens = int(meta.get("completion_tokens", len(out.get("output_ids", []))))
        verify = meta.get("spec_verify_ct")
        records.append({"prompt": i, "completion_tokens": tokens, "spec_verify_ct": verify,
                        "tau": tokens / verify if verify else None, "latency_s": out["latency_s"]})
    return records


def _throughput(records: list[dict]) -> float:
    seconds = sum(r["latency_s"] for r in records)
    return sum(r["completion_tokens"] for r in records) / seconds if seconds > 0 else float("nan")


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


def run_sglang_bench(cfg: Any, target_path, draft_dir, prompts: list, out: Path, reporter,
                     extract_manifest=None, server_cmd: list[str] | None = None) -> dict:
    """Launches SGLang with the draft and without, sends `prompts`, returns the bench/* metrics."""
    serve, bench, out = cfg.serve, cfg.bench, Path(out)
    if not prompts:
        raise ValueError("prompts: at least one held-out prompt is needed")
    out.mkdir(parents=True, exist_ok=True)
    draft = prepare_draft(draft_dir, out, target_path, serve.sglang_rules, extract_manifest)
    steps, topk, ndt = spec_params(serve)
    spec_argv = _with_command(build_server_argv(serve, target_path, draft, decode_log_interval=1), server_cmd)
    base_argv = _with_command(build_baseline_argv(serve, target_path), server_cmd)
    client = SGLangClient(serve.host, serve.port)
    # Jobs of a sweep share serve.port, and SGLang binds it only minutes into its start: without this
    # machine-wide lock a second job's health check could be answered by the first job's server.
    with file_lock(Path(tempfile.gettempdir()) / f"draftlab-sglang-port-{serve.port}.lock"):
        with _server(spec_argv, out, "speculative", serve, reporter, "bench/startup"):
            _warm(client, prompts)
            spec_records = _run_prompts(client, prompts, bench)
            info = client.server_info()
        with _server(base_argv, out, "baseline", serve, reporter, "bench/baseline_startup"):
            _warm(client, prompts)
            base_records = _run_prompts(client, prompts, bench)

    tokens = sum(r["completion_tokens"] for r in spec_records)
    verify = sum(r["spec_verify_ct"] or 0 for r in spec_records)
    if verify == 0:
        raise RuntimeError("SGLang returned no spec_verify_ct: the server did not run speculative decoding")
    metrics = {"bench/tau": tokens / verify, "bench/tokens_per_s": _throughput(spec_records),
               "bench/baseline_tokens_per_s": _throughput(base_records)}
    metrics["bench/speedup"] = metrics["bench/tokens_per_s"] / metrics["bench/baseline_tokens_per_s"]
    warnings = _cross_check(metrics, info, (steps, topk, ndt))
    server_tau = server_accept_length(info)
    if server_tau is not None:
        metrics["bench/server_accept_length"] = server_tau
    if metrics["bench/tau"] <= bench.tau_fail:
        warnings.append(f"bench/tau {metrics['bench/tau']:.3f} <= bench.tau_fail {bench.tau_fail}: the draft "
                        "contributes nothing in SGLang (dropped weights, wrong layers or algorithm?)")
    for warning in warnings:
        log.warning("sglang bench: %s", warning)
    result_path = out / "sglang_bench.json"
    atomic_write_json(result_path, {
        "metrics": metrics, "warnings": warnings, "spec_argv": spec_argv, "baseline_argv": base_argv,
        "draft_dir": str(draft), "speculative": spec_records, "baseline": base_records,
        "server_info": {k: info.get(k) for k in ("speculative_algorithm", "speculative_num_steps",
                                                   "speculative_eagle_topk", "speculative_num_draft_tokens",
                                                   "version", "internal_states")},
    })
    reporter.metrics(metrics)
    reporter.artifact(result_path)
    return metrics


def _cross_check(metrics: dict, info: dict, wanted: tuple[int, int, int]) -> list[str]:
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
    elif not math.isclose(server_tau, metrics["bench/tau"], rel_tol=CROSS_CHECK_TOLERANCE):
        warnings.append(f"per-request tau {metrics['bench/tau']:.3f} and the server's avg_spec_accept_length "
                        f"{server_tau:.3f} differ by more than {CROSS_CHECK_TOLERANCE:.0%}")
    return warnings

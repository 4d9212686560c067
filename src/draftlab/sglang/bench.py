"""Benchmark a draft in the real SGLang server: acceptance and throughput, the baseline the same server without
speculation.

Order: check-draft (a failing draft is never launched: a 15-minute start that serves at tau ~1 is the failure this
exists to prevent), speculative server -> every set's prompts one at a time, then each batch size above 1 as that
many concurrent requests -> stop; baseline server -> the same -> stop. The serving grid is sglang/grid.py's.
Metrics, under `bench/sglang/` (PREFIX): per set `<set>/tau` (+ _lo/_hi), `accept_rate_<j>` (+ _lo/_hi),
`accept_length`, `speedup` (+ _lo/_hi), `tokens_per_s`, `baseline_tokens_per_s`, `prompts`, `server_accept_length`,
`greedy_match_frac`; per batch size `bs<B>/{tokens_per_s,baseline_tokens_per_s,speedup,tau}`; start-up phases under
`startup/` and `baseline_startup/`.

tau is SGLang's own count: per request, meta_info's completion_tokens over spec_verify_ct, pooled over a set (sums,
as the server's average pools). It counts the prefill's first token; `accept_length` does not (1 + correct drafts per
verify step, from meta_info's spec_correct_drafts_histogram, which also gives accept_rate_<j>). The server's own
/server_info avg_spec_accept_length (advanced every decode-log interval; we launch with --decode-log-interval 1) is
read after each set, its counters reset (/flush_cache) before it, and cross-checked.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from draftlab.util.fsutil import atomic_write_json, atomic_write_text, file_lock
from draftlab.stats.intervals import set_metrics
from draftlab.sglang import requests
from draftlab.sglang.check import check_draft
from draftlab.sglang.client import SGLangClient, server_accept_length
from draftlab.sglang.formats import convert, detect_format
from draftlab.sglang.launch import build_baseline_argv, build_server_argv, spec_params
from draftlab.sglang.monitor import SGLangServer

log = logging.getLogger("draftlab.sglang")
PREFIX = "bench/sglang"
CROSS_CHECK_TOLERANCE = 0.15  # relative; meta_info includes the prefill token, the server average does not


class DraftCheckError(RuntimeError):
    """check-draft failed; the draft was not launched."""


def prepare_draft(draft_dir: Path, out: Path, target_path, rules: str, extract_manifest=None,
                  sglang_version: str | None = None) -> Path:
    """A speculators-format draft is converted to SGLang format; then check-draft must pass, against the contract
    of the SGLang version that serves it."""
    draft_dir = Path(draft_dir)
    if detect_format(draft_dir) == "speculators":
        draft_dir = convert(draft_dir, out / "draft-sglang", "sglang")
        log.info("converted the speculators-format draft to SGLang format in %s", draft_dir)
    report = check_draft(draft_dir, target_path, rules, extract_manifest, sglang_version=sglang_version)
    atomic_write_text(out / "check-draft.txt", report.summary() + "\n")
    if not report.ok:
        raise DraftCheckError("check-draft failed, SGLang not launched:\n" + report.summary())
    for finding in report.findings:
        log.warning("check-draft: %s", finding)
    return draft_dir


def server_env(serve: Any) -> dict[str, str]:
    """This process's environment with `serve.env` laid over it: the server may need its own site (PYTHONPATH)
    that draftlab's stages must not import from."""
    extra = dict(getattr(serve, "env", None) or {})
    return {**os.environ, **{str(k): str(v) for k, v in extra.items()}}


def server(argv, out: Path, name: str, serve: Any, reporter, prefix: str) -> SGLangServer:
    return SGLangServer(argv, out / f"{name}.log", host=serve.host, port=serve.port,
                        timeout_s=serve.startup_timeout_s, reporter=reporter, name=f"sglang-{name}",
                        metric_prefix=prefix, env=server_env(serve))


def with_command(argv: list[str], server_cmd: list[str] | None) -> list[str]:
    """Replaces `python -m sglang.launch_server` (the first three items) by server_cmd, for tests."""
    return argv if server_cmd is None else list(server_cmd) + argv[3:]


def port_lock(serve: Any):
    # Jobs of a sweep share serve.port, and SGLang binds it only minutes into its start: without this
    # machine-wide lock a second job's health check could be answered by the first job's server.
    return file_lock(Path(tempfile.gettempdir()) / f"draftlab-sglang-port-{serve.port}.lock")


def run_sglang_bench(serve: Any, bench: Any, target_path, draft_dir, sets: dict[str, list], out: Path, reporter,
                     extract_manifest=None, server_cmd: list[str] | None = None) -> tuple[dict, list[dict]]:
    """Launches SGLang with the draft and without (`serve`: the serve.* settings), sends every set's prompts
    (`sets`: name -> prompts, ids or text) as `bench` (bench.*) says; returns (the bench/sglang/* metrics, the
    per-request rows)."""
    out = Path(out)
    if not sets or not all(sets.values()):
        raise ValueError("prompts: every bench set needs at least one prompt")
    out.mkdir(parents=True, exist_ok=True)
    draft = prepare_draft(draft_dir, out, target_path, serve.sglang_rules, extract_manifest,
                          getattr(serve, "sglang_version", None))
    steps, topk, ndt = spec_params(serve)
    spec_argv = with_command(build_server_argv(serve, target_path, draft, decode_log_interval=1), server_cmd)
    base_argv = with_command(build_baseline_argv(serve, target_path), server_cmd)
    client = SGLangClient(serve.host, serve.port)
    sizes = [b for b in bench.batch_sizes if b > 1]
    first = next(iter(sets))
    with port_lock(serve):
        with server(spec_argv, out, "speculative", serve, reporter, f"{PREFIX}/startup"):
            requests.warm(client, sets[first])
            spec_records, infos, spec_batches = requests.serve_sets(client, sets, sizes, bench, server_tau=True)
        with server(base_argv, out, "baseline", serve, reporter, f"{PREFIX}/baseline_startup"):
            requests.warm(client, sets[first])
            base_records, _, base_batches = requests.serve_sets(client, sets, sizes, bench, server_tau=False)

    metrics, rows, warnings = {}, [], []
    for name in sets:
        set_rows = requests.rows(name, spec_records[name], base_records[name])
        if sum(r["verify_steps"] for r in set_rows) == 0:
            raise RuntimeError("SGLang returned no spec_verify_ct: the server did not run speculative decoding")
        rows += set_rows
        p = f"{PREFIX}/{name}"
        metrics.update(set_metrics(p, set_rows, steps, bench.seed))
        metrics.update(requests.extra_set_metrics(p, set_rows))
        server_tau = server_accept_length(infos[name])
        if server_tau is not None:
            metrics[f"{p}/server_accept_length"] = server_tau
        warnings += [f"{name}: {w}" for w in cross_check(metrics[f"{p}/tau"], infos[name], (steps, topk, ndt))]
    metrics.update(requests.batch_metrics(metrics, f"{PREFIX}/{first}", spec_batches, base_batches, PREFIX))
    if metrics[f"{PREFIX}/{first}/tau"] <= bench.tau_fail:
        warnings.append(f"{PREFIX}/{first}/tau {metrics[f'{PREFIX}/{first}/tau']:.3f} <= bench.tau_fail "
                        f"{bench.tau_fail}: the draft contributes nothing in SGLang (dropped weights, wrong layers?)")
    for warning in warnings:
        log.warning("sglang bench: %s", warning)
    info = infos[first]
    result = {"metrics": metrics, "warnings": warnings, "spec_argv": spec_argv, "baseline_argv": base_argv,
              "draft_dir": str(draft), "speculative": spec_records, "baseline": base_records,
              "batches": {"speculative": spec_batches, "baseline": base_batches},
              "server_info": {k: info.get(k) for k in ("speculative_algorithm", "speculative_num_steps",
                                                         "speculative_eagle_topk", "speculative_num_draft_tokens",
                                                         "version", "internal_states")}}
    result_path = out / "sglang_bench.json"
    atomic_write_json(result_path, result)
    reporter.metrics(metrics)
    reporter.artifact(result_path)
    return metrics, rows


def cross_check(tau: float, info: dict, wanted: tuple[int, int, int]) -> list[str]:
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

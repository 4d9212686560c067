"""The requests a bench sends to an SGLang server, and the per-request records and metrics made of the answers.

Batch size 1 is each set's prompts one at a time. A batch size B above 1 is B requests in flight at once: B
workers take the first set's prompts in turn (cycled so that every worker has as many), which is how a server
meets B users; tokens/s is all completion tokens over the wall time of the whole run.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from draftlab.sglang.client import SGLangClient

NAN = float("nan")


def record(i: int, out: dict) -> dict:
    """One answer: its tokens, verify steps, accepted drafts per verify step (from the histogram), latency."""
    meta = out.get("meta_info", {})
    tokens = int(meta.get("completion_tokens", len(out.get("output_ids", []))))
    verify = meta.get("spec_verify_ct")
    hist = meta.get("spec_correct_drafts_histogram") or meta.get("spec_accept_histogram")
    row = {"prompt": i, "completion_tokens": tokens, "spec_verify_ct": verify,
           "tau": tokens / verify if verify else None, "latency_s": out["latency_s"],
           "output_ids": [int(t) for t in out.get("output_ids", [])]}
    if hist:
        row["correct_drafts_histogram"] = [int(c) for c in hist]
    return row


def run_prompts(client: SGLangClient, prompts: list, bench: Any) -> list[dict]:
    return [record(i, client.generate(p, bench.max_new_tokens, bench.temperature)) for i, p in enumerate(prompts)]


def run_concurrent(client: SGLangClient, prompts: list, size: int, bench: Any) -> dict:
    """`size` requests in flight until the prompts (cycled to a multiple of `size`) are answered."""
    count = -(-len(prompts) // size) * size
    queue = [prompts[i % len(prompts)] for i in range(count)]

    def one(i):
        return record(i, client.generate(queue[i], bench.max_new_tokens, bench.temperature))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=size) as pool:
        answers = list(pool.map(one, range(count)))
    seconds = time.perf_counter() - t0
    tokens = sum(a["completion_tokens"] for a in answers)
    verify = sum(a["spec_verify_ct"] or 0 for a in answers)
    return {"requests": count, "tokens": tokens, "seconds": seconds, "verify_steps": verify}


def warm(client: SGLangClient, prompts: list) -> None:
    client.generate(prompts[0], 8)  # first-request JIT/allocations stay out of the timed runs
    client.flush_cache()  # resets the server's acceptance counters (404 on servers without it)


def serve_sets(client: SGLangClient, sets: dict[str, list], sizes: list[int], bench: Any, server_tau: bool):
    """Every set's records, the server's /server_info after each set (when speculative), and per batch size
    above 1 its concurrent run on the first set's prompts."""
    records, infos, batches = {}, {}, {}
    for name, prompts in sets.items():
        if server_tau:
            client.flush_cache()  # the server's acceptance counters count this set alone
        records[name] = run_prompts(client, prompts, bench)
        if server_tau:
            infos[name] = client.server_info()
    first = next(iter(sets.values()))
    for size in sizes:
        batches[size] = run_concurrent(client, first, size, bench)
    return records, infos, batches


def accepted(record: dict) -> list[int] | None:
    """Drafts accepted at each verify step, in no particular order, from SGLang's histogram."""
    hist = record.get("correct_drafts_histogram")
    if not hist:
        return None
    return [a for a, count in enumerate(hist) for _ in range(count)]


def rows(name: str, spec: list[dict], base: list[dict]) -> list[dict]:
    """The per-request table's rows (stats/intervals.py's keys)."""
    out = []
    for s, b in zip(spec, base):
        row = {"set": name, "prompt": s["prompt"], "tokens": s["completion_tokens"],
               "verify_steps": s["spec_verify_ct"] or 0, "tau": s["tau"], "spec_s": s["latency_s"],
               "baseline_tokens": b["completion_tokens"], "base_s": b["latency_s"],
               "same_output": s["output_ids"] == b["output_ids"]}
        acc = accepted(s)
        if acc is not None and len(acc) == row["verify_steps"]:
            row["accepted"] = acc
        out.append(row)
    return out


def extra_set_metrics(prefix: str, set_rows: list[dict]) -> dict[str, float]:
    """accept_length (the prefill token left out) and the fraction of answers equal to the baseline's."""
    m = {f"{prefix}/greedy_match_frac": sum(r["same_output"] for r in set_rows) / len(set_rows)}
    if all("accepted" in r for r in set_rows):
        steps = sum(r["verify_steps"] for r in set_rows)
        m[f"{prefix}/accept_length"] = 1 + sum(sum(r["accepted"]) for r in set_rows) / steps if steps else NAN
    return m


def batch_metrics(metrics: dict, first: str, spec: dict, base: dict, prefix: str) -> dict[str, float]:
    """<prefix>/bs<B>/...: batch size 1 is the first set's sequential run, larger ones its concurrent runs."""
    m = {f"{prefix}/bs1/tokens_per_s": metrics[f"{first}/tokens_per_s"],
         f"{prefix}/bs1/baseline_tokens_per_s": metrics[f"{first}/baseline_tokens_per_s"],
         f"{prefix}/bs1/speedup": metrics[f"{first}/speedup"], f"{prefix}/bs1/tau": metrics[f"{first}/tau"]}
    for size, run in spec.items():
        p, b = f"{prefix}/bs{size}", base[size]
        m[f"{p}/tokens_per_s"] = run["tokens"] / run["seconds"] if run["seconds"] > 0 else NAN
        m[f"{p}/baseline_tokens_per_s"] = b["tokens"] / b["seconds"] if b["seconds"] > 0 else NAN
        m[f"{p}/speedup"] = m[f"{p}/tokens_per_s"] / m[f"{p}/baseline_tokens_per_s"]
        m[f"{p}/tau"] = run["tokens"] / run["verify_steps"] if run["verify_steps"] else NAN
    return m

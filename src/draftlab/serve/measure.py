"""The local engine's timing of a draft: every prompt decoded speculatively and plainly, alternating which goes
first so drift and warm-up hit both equally, and the pooled numbers of such a run (`summarize`: bench/tau,
bench/speedup, bench/accept_rate_<j>, ...). serve/local_bench.py runs it over the bench's sets.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

import torch

from draftlab.model.attention import variable_shape_attention
from draftlab.serve import step_costs
from draftlab.serve.engine import Generation, SpecEngine, target_decode
from draftlab.serve.modes import DYNAMIC, EngineMode, graph_report, target_runner
from draftlab.util.progress import bar_over


@dataclass
class BenchRun:
    spec: list[Generation] = field(default_factory=list)
    base: list[Generation] = field(default_factory=list)
    graphs: dict = field(default_factory=dict)  # fixed-shape step -> graph | eager | why its capture failed
    step_ms: dict = field(default_factory=dict)  # serve/step_costs.py: each engine step on its own
    sync_free: bool = False  # whole cycles replayed with no host sync inside (serve/sync_free.py)


@variable_shape_attention()  # (a context manager, entered afresh on every call)
def measure(model, drafter, prompts: list[list[int]], num_steps: int, max_new_tokens: int,
            temperature: float, eos_token_ids, seed: int = 0, warmup: bool = True,
            mode: EngineMode = DYNAMIC, sync_free: bool | None = None) -> BenchRun:
    """Speculative and plain decoding of every prompt, alternating which goes first; both decoders use `mode`'s
    KV cache (and CUDA graphs), sized once for the longest prompt so every step keeps one shape. Every prompt's
    prefill has another length, so the whole measurement keeps out of cuDNN's attention, which plans each new shape
    on the host (model/attention.py): those plans would be timed, and would depend on what the process ran before.
    sync_free (default: with CUDA graphs and greedy decoding): both decoders replay whole cycles with no host sync
    inside (serve/sync_free.py); on a CPU every op is synchronous anyway, so that only adds the EOS overshoot."""
    from draftlab.serve.sync_free import SyncFreePlain, SyncFreeSpec

    layers = tuple(getattr(drafter, "feature_layers", ()))
    engine = SpecEngine(model, drafter, num_steps, eos_token_ids, runner=target_runner(model, mode, layers))
    if sync_free is None:
        sync_free = mode.cuda_graphs and temperature <= 0
    decoder = SyncFreeSpec(engine) if sync_free else engine
    # sized before the warm-up, so no step is captured again mid-measurement
    longest = decoder.reserve(max(len(p) for p in prompts), max_new_tokens)
    runner = target_runner(model, mode, (), longest)
    plain = SyncFreePlain(runner) if sync_free else None
    device = runner.device
    gen = torch.Generator(device=device)

    def seeded(i):  # each prompt its own stream, the same for both decoders; None when greedy
        return gen.manual_seed(seed + i) if temperature > 0 else None

    def spec(ids, n, i):
        return decoder.generate(ids, n, temperature, seeded(i))

    def base(ids, n, i):
        if plain is not None:
            return plain.generate(ids, n, eos_token_ids)
        return target_decode(model, ids, n, eos_token_ids, temperature, seeded(i), runner=runner)

    if warmup:  # first-call allocations, kernel selection and graph captures stay out of the timings
        n = min(2 * (num_steps + 1) + 2, max_new_tokens)  # two cycles at least, even if every draft is accepted
        eos, decoder.eos = decoder.eos, set()  # no early stop, so every step shape runs once
        spec(prompts[0], n, len(prompts))
        decoder.eos = eos
        if plain is not None:
            plain.generate(prompts[0], n, [])
        else:
            target_decode(model, prompts[0], n, [], temperature, seeded(len(prompts)), runner=runner)
    run = BenchRun(sync_free=sync_free)
    for i, ids in enumerate(bar_over(prompts, "bench", "prompt")):
        if i % 2 == 0:
            run.spec.append(spec(ids, max_new_tokens, i))
            run.base.append(base(ids, max_new_tokens, i))
        else:
            run.base.append(base(ids, max_new_tokens, i))
            run.spec.append(spec(ids, max_new_tokens, i))
    if mode.static_cache:  # timed halfway through the measured answers
        position = sum(g.prompt_len + len(g.tokens) // 2 for g in run.spec) // max(len(run.spec), 1)
        run.step_ms = step_costs.measure(engine.target, engine.drafter, runner, num_steps, position)
    run.graphs = graph_report(engine.target, engine.drafter, runner, decoder, plain)
    # the runners' step closures refer back to them, so their KV caches and graphs would outlive this call until
    # the collector happened to run (spec_decode.py measures many modes in one process)
    del engine, decoder, runner, plain, spec, base
    gc.collect()
    return run


def summarize(run: BenchRun, num_steps: int, temperature: float) -> dict[str, float]:
    tokens = sum(len(g.tokens) for g in run.spec)
    steps = sum(g.verify_steps for g in run.spec)
    accepted = [a for g in run.spec for a in g.accepted]
    spec_s = sum(g.seconds for g in run.spec)
    base_tokens, base_s = sum(len(g.tokens) for g in run.base), sum(g.seconds for g in run.base)
    m = {
        "bench/tau": tokens / steps if steps else float("nan"),
        "bench/verify_steps": float(steps),
        "bench/tokens": float(tokens),
        "bench/prompts": float(len(run.spec)),
        "bench/mean_accepted": sum(accepted) / len(accepted) if accepted else 0.0,
        # per verify step, bonus included, prefill token excluded: SGLang's server-level accept length
        "bench/accept_length": 1 + sum(accepted) / len(accepted) if accepted else float("nan"),
        "bench/tokens_per_s": tokens / spec_s if spec_s > 0 else float("nan"),
        "bench/baseline_tokens_per_s": base_tokens / base_s if base_s > 0 else float("nan"),
        "bench/cycle_ms": 1000 * spec_s / steps if steps else float("nan"),  # prefills included
    }
    m["bench/speedup"] = m["bench/tokens_per_s"] / m["bench/baseline_tokens_per_s"]
    for j in range(num_steps):
        m[f"bench/accept_rate_{j}"] = sum(a > j for a in accepted) / len(accepted) if accepted else 0.0
    if temperature <= 0:  # greedy must reproduce the target; bf16 near-ties may flip a token, so it is reported
        same = sum(s.tokens == b.tokens for s, b in zip(run.spec, run.base))
        m["bench/greedy_match_frac"] = same / len(run.spec)
    return m


@dataclass
class EngineResult:
    """One engine's part of the bench: its metrics, the draft's problems as SGLang would load it, one row per
    prompt, each set's prompts (name -> ids), and the first set's speculative Generations (the local engine's
    histogram; empty for SGLang)."""
    metrics: dict[str, float]
    problems: list[str]
    rows: list[dict]
    prompts: dict[str, list]
    first_spec: list[Generation] = field(default_factory=list)

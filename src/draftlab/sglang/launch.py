"""The SGLang 0.5.23 server command line, built from `serve.*` as an argument list (never a shell string).

Rules learnt from SGLang's own argument handling (arg_groups/ in the 0.5.23 wheel):
- An EAGLE-3 draft only works under `--speculative-algorithm EAGLE3`. Under EAGLE (and NEXTN, which becomes
  EAGLE) the target captures no aux layers, the widths match, fc is skipped and accept length is 1.0.
- steps / topk / num-draft-tokens are given together or SGLang asserts (topk without steps) or crashes
  (steps alone); with topk 1 it silently rewrites num-draft-tokens to steps + 1, so we require exactly that.
- CUDA-graph flags by their current names: `--cuda-graph-max-bs-decode` (plain `--cuda-graph-max-bs` is now
  an ambiguous prefix and argparse exits 2), `--cuda-graph-backend-{decode,prefill} disabled` to turn graphs
  off (`--disable-cuda-graph` is deprecated).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EAGLE3_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
# Flags this module owns; passing them again through serve.extra_args would make the command ambiguous.
MANAGED = ("--model-path", "--host", "--port", "--dtype", "--tp-size", "--mem-fraction-static", "--device",
           "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
           "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--cuda-graph-max-bs-decode",
           "--cuda-graph-backend-decode", "--cuda-graph-backend-prefill", "--decode-log-interval")
RETIRED = {"--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
           "--disable-cuda-graph": "--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled"}


class LaunchError(ValueError):
    """The launch would fail late or silently; the message names the serve.* key."""


def _get(serve: Any, key: str, default: Any = None) -> Any:
    if isinstance(serve, dict):
        return serve.get(key, default)
    return getattr(serve, key, default)


def spec_params(serve: Any) -> tuple[int, int, int]:
    """(num_steps, topk, num_draft_tokens), validated the way SGLang should but does not."""
    steps, topk, ndt = _get(serve, "num_steps"), _get(serve, "topk"), _get(serve, "num_draft_tokens")
    if not isinstance(steps, int) or steps < 1:
        raise LaunchError(f"serve.num_steps: must be an integer >= 1, got {steps!r}")
    if not isinstance(topk, int) or topk < 1:
        raise LaunchError(f"serve.topk: must be an integer >= 1, got {topk!r}")
    if topk == 1:
        if ndt is None:
            ndt = steps + 1
        elif ndt != steps + 1:
            raise LaunchError(f"serve.num_draft_tokens: {ndt} with topk 1 must be num_steps + 1 = {steps + 1} "
                              "(SGLang would silently change it)")
    else:
        if ndt is None:
            raise LaunchError(f"serve.num_draft_tokens: required when serve.topk = {topk} > 1 "
                              f"(2 .. num_steps * topk + 1 = {steps * topk + 1})")
        if not 2 <= ndt <= steps * topk + 1:
            raise LaunchError(f"serve.num_draft_tokens: {ndt} must be in 2 .. num_steps * topk + 1 = "
                              f"{steps * topk + 1} (SGLang does not check this)")
    return steps, topk, ndt


def draft_architecture(draft_dir: Path) -> str | None:
    config_path = Path(draft_dir) / "config.json"
    if not config_path.exists():
        return None
    archs = json.loads(config_path.read_text()).get("architectures") or [None]
    return archs[0]


def check_algorithm(serve: Any, draft_dir: Path) -> str:
    algorithm = str(_get(serve, "algorithm", "EAGLE3")).upper()
    arch = draft_architecture(draft_dir)
    if algorithm in ("EAGLE", "NEXTN") and arch in EAGLE3_ARCHS:
        raise LaunchError(f"serve.algorithm: {algorithm} with an EAGLE-3 draft ({arch}) serves at accept length 1.0 "
                          "without an error (no aux layers captured, fc skipped); use EAGLE3")
    if algorithm != "EAGLE3":
        raise LaunchError(f"serve.algorithm: {algorithm!r}: draftlab drafts are EAGLE-3, launch them with EAGLE3")
    if arch is not None and arch not in EAGLE3_ARCHS:
        raise LaunchError(f"draft architectures: {arch!r} is not an SGLang EAGLE-3 class; run check-draft")
    return algorithm


def _check_extra(extra: list[str]) -> list[str]:
    extra = [str(a) for a in extra or []]
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag in RETIRED:
            raise LaunchError(f"serve.extra_args: {flag} is not accepted by SGLang 0.5.23; use {RETIRED[flag]}")
        if flag in MANAGED:
            raise LaunchError(f"serve.extra_args: {flag} is set from serve.* already")
    return extra


def _dtype(serve: Any) -> str:
    # auto would let the draft take its own torch_dtype (float32 -> float16) independently of the target.
    dtype = _get(serve, "dtype", "auto")
    return "bfloat16" if dtype in (None, "auto") else str(dtype)


def base_argv(serve: Any, target_path: str | Path, port: int | None = None) -> list[str]:
    python = _get(serve, "python") or "python"
    host = _get(serve, "host") or "127.0.0.1"
    argv = [str(python), "-m", "sglang.launch_server", "--model-path", str(target_path), "--host", str(host),
            "--port", str(port if port is not None else _get(serve, "port", 30000)), "--dtype", _dtype(serve),
            "--tp-size", str(_get(serve, "tp_size", 1) or 1)]
    if _get(serve, "mem_fraction_static") is not None:
        fraction = float(_get(serve, "mem_fraction_static"))
        if not 0.0 < fraction < 1.0:
            raise LaunchError(f"serve.mem_fraction_static: must be in (0, 1), got {fraction}")
        argv += ["--mem-fraction-static", str(fraction)]
    device = _get(serve, "device", "auto")
    if device not in (None, "auto"):
        argv += ["--device", str(device)]
    if _get(serve, "cuda_graph", True):
        if _get(serve, "cuda_graph_max_bs") is not None:
            argv += ["--cuda-graph-max-bs-decode", str(int(_get(serve, "cuda_graph_max_bs")))]
    else:
        argv += ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    return argv


def build_server_argv(serve: Any, target_path: str | Path, draft_dir: str | Path, port: int | None = None,
                      decode_log_interval: int | None = None) -> list[str]:
    """The speculative server: target + EAGLE-3 draft, every speculative parameter explicit."""
    check_algorithm(serve, Path(draft_dir))
    steps, topk, ndt = spec_params(serve)
    argv = base_argv(serve, target_path, port)
    argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft_dir),
             "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
             "--speculative-num-draft-tokens", str(ndt)]
    if decode_log_interval is not None:
        # avg_spec_accept_length in /server_info only advances every decode_log_interval decode steps
        argv += ["--decode-log-interval", str(int(decode_log_interval))]
    return argv + _check_extra(_get(serve, "extra_args") or [])


def build_baseline_argv(serve: Any, target_path: str | Path, port: int | None = None) -> list[str]:
    """The same server without speculation, for the baseline throughput."""
    return base_argv(serve, target_path, port) + _check_extra(_get(serve, "extra_args") or [])

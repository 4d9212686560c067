"""Runs REAL SGLang code on a CPU, inside the separate sglang venv (scripts/setup-sglang.sh); not imported by draftlab.

    <sglang-venv>/bin/python contract_probe.py jobs.json   -> prints one JSON line prefixed with PROBE_RESULT

Jobs:
- {"kind": "args", "argv": [...]}: SGLang's own prepare_server_args(argv) then ServerArgs.resolve_once()
  (with an H200's memory pretended, since there is no GPU), returning the resolved speculative values.
- {"kind": "weights", "draft": folder}: builds SGLang's LlamaForCausalLMEagle3 on the meta device from the
  folder's config.json and runs its own load_weights over the checkpoint (meta tensors of the right shapes,
  real d2t/t2d), recording which parameter (and shard) every checkpoint key was written into.

Standalone on purpose: the sglang venv does not have draftlab installed.
"""

import json
import os
import socket
import struct
import sys
import traceback
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)  # our sibling modules (launch, client, ...) must not shadow anything sglang imports

H200_MIB = 143771


def _pretend_h200():
    """There is no GPU: resolution asks for the device's memory, so an H200's is answered. 0.5.23 asks through
    its memory hook; 0.5.17 resolves inside ServerArgs.__post_init__ with the name server_args imported."""
    try:
        import sglang.srt.arg_groups.memory_hook as memory_hook
    except ImportError:
        memory_hook = None
    if memory_hook is not None and hasattr(memory_hook, "get_device_memory_capacity"):
        memory_hook.get_device_memory_capacity = lambda *a, **k: H200_MIB
    import sglang.srt.server_args as server_args

    if hasattr(server_args, "get_device_memory_capacity"):
        server_args.get_device_memory_capacity = lambda *a, **k: H200_MIB


def _plain(value):
    """A resolved value as JSON: nested configs (dataclasses, msgspec structs) become dicts."""
    import dataclasses

    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "__struct_fields__"):
        return {name: _plain(getattr(value, name)) for name in value.__struct_fields__}
    return str(value)


def run_args(job):
    _pretend_h200()
    import sglang
    from sglang.srt.server_args import prepare_server_args

    argv = list(job["argv"])
    if "--device" not in argv:
        argv += ["--device", "cuda"]  # without it resolution asks for an accelerator this host lacks
    try:
        args = prepare_server_args(argv)  # 0.5.17 resolves here, in ServerArgs.__post_init__
    except SystemExit as err:  # argparse errors (e.g. an ambiguous flag) exit 2
        return {"ok": False, "stage": "parse", "error": f"argparse exit {err.code}"}
    except Exception as err:  # noqa: BLE001
        return {"ok": False, "stage": "parse", "error": f"{type(err).__name__}: {err}"}
    try:
        if hasattr(args, "resolve_once"):  # 0.5.23 parses first and resolves on request
            args.resolve_once()
            resolved = args.resolved_dict()
        else:
            resolved = {}
    except Exception as err:  # noqa: BLE001
        return {"ok": False, "stage": "resolve", "error": f"{type(err).__name__}: {err}"}
    keys = ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
            "speculative_num_draft_tokens", "dtype", "tp_size", "host", "port", "mem_fraction_static",
            "max_running_requests", "decode_log_interval", "cuda_graph_config", "model_path", "attention_backend",
            "sampling_backend", "grammar_backend", "mm_feature_transport", "disable_cuda_graph")
    return {"ok": True, "version": sglang.__version__,
            "resolved": {k: _plain(resolved[k] if k in resolved else getattr(args, k, None)) for k in keys}}


def _init_single_process():
    import torch

    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port)), ("RANK", "0"),
                       ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    if not torch.distributed.is_initialized():
        parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    if not parallel_state.model_parallel_is_initialized():
        reset_context()
        publish(ServerArgs(model_path="dummy", tp_size=1, ep_size=1, pp_size=1, device="cpu"), role="test",
                ranks=SpawnRanks(world_rank=0))
        get_parallel().override_permanently(world_group=parallel_state._WORLD)
        parallel_state.initialize_model_parallel(backend="gloo")


def _headers(folder):
    out = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        header.pop("__metadata__", None)
        out.update({k: (path, v) for k, v in header.items()})
    return out


def run_weights(job):
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig

    import sglang.srt.models.llama_eagle3 as eagle3

    _init_single_process()
    folder = job["draft"]
    config = AutoConfig.from_pretrained(folder)
    try:
        with torch.device("meta"):
            model = eagle3.LlamaForCausalLMEagle3(config)
    except Exception as err:  # noqa: BLE001
        return {"ok": False, "stage": "build", "error": f"{type(err).__name__}: {err}"}
    params = dict(model.named_parameters())
    names = {id(p): n for n, p in params.items()}
    current = {"key": None}
    writes = []  # (checkpoint key, parameter, shard)

    def record(loader):
        def wrapped(param, weight, *shard):
            writes.append((current["key"], names.get(id(param), "?"), shard[0] if shard else None))
            return loader(param, weight, *shard)
        return wrapped

    for param in params.values():
        if hasattr(param, "weight_loader"):
            param.weight_loader = record(param.weight_loader)
    eagle3.default_weight_loader = record(eagle3.default_weight_loader)

    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64,
              "I32": torch.int32, "BOOL": torch.bool}
    headers = _headers(folder)

    def stream():
        for key, (path, info) in headers.items():
            current["key"] = key
            if "d2t" in key or "t2d" in key:  # small: load for real so hot_token_id can be checked
                with safe_open(str(path), framework="pt") as handle:
                    yield key, handle.get_tensor(key)
            else:
                yield key, torch.empty(info["shape"], dtype=dtypes.get(info["dtype"], torch.float32), device="meta")

    error = None
    try:
        model.load_weights(stream())
    except Exception as err:  # noqa: BLE001 - a shape assert is a result, not a probe failure
        error = f"{type(err).__name__}: {err} (at key {current['key']})"
        traceback.print_exc(file=sys.stderr)
    written = {}
    for key, param, shard in writes:
        written.setdefault(param, []).append([key, shard])
    consumed = {key for key, _, _ in writes}
    hot = model.get_hot_token_id() if hasattr(model, "get_hot_token_id") else None
    return {
        "ok": error is None, "error": error,
        "params": {n: list(p.shape) for n, p in params.items()},
        "written": written,
        "never_written": sorted(n for n in params if n not in written),
        "keys_not_consumed": sorted(k for k in headers if k not in consumed and "d2t" not in k and "t2d" not in k),
        "hot_token_id": None if hot is None else [int(hot.min()), int(hot.max()), int(hot.numel())],
    }


def main():
    jobs = json.loads(Path(sys.argv[1]).read_text())
    results = []
    for job in jobs:
        try:
            results.append(run_args(job) if job["kind"] == "args" else run_weights(job))
        except Exception as err:  # noqa: BLE001
            traceback.print_exc(file=sys.stderr)
            results.append({"ok": False, "stage": "probe", "error": f"{type(err).__name__}: {err}"})
    print("PROBE_RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()

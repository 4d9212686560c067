"""The Triton code Inductor writes for the trainer's compiled unroll on an H200, written on a machine without a GPU.

Device time is scarce (30 minutes a session, and some sessions none). Which kernels a change makes, and what each
computes per element, can be read without a GPU: this traces `packed_core` on the CPU through Inductor's own
pipeline (its joint-graph passes, its partition into forward and backward), then lowers each graph a second time for
`cuda:0`, with Inductor told that the device is an H200 (sm_90, 132 SMs) and Triton that its target is one. The
kernels are written, never compiled or run: no timing comes from here, only what each kernel reads, stores and
computes.

It needs the torch that the H200 machines run (2.11.0, a CUDA build), since the partition and the fusions are that
version's; the project's own environment has a CPU build. Checked against a profile once: for the code profiled in
the twenty-fifth session, the backward's loss kernel written here has the name of the one the H200 ran, the step's
largest (BENCHMARKS.md, twenty-seventh session). The trace runs under the CPU's bf16 autocast, whose lists of ops
cast down or kept in fp32 are not CUDA's: a kernel's dtypes here can differ from the H200's where an op is in one
list and not the other (the loss itself upcasts explicitly, the same on both).

    python -m venv /tmp/t211 && /tmp/t211/bin/pip install torch==2.11.0 numpy safetensors omegaconf
    /tmp/t211/bin/python bench/inductor_h200_code.py --out /tmp/h200_code       # about 3 minutes on 2 cores

Writes forward.py and backward.py (Inductor's output code for each graph) and kernels.json (per kernel: its kind,
the exps it computes per element, its loads, whether it stores a [rows, draft vocabulary] tensor), and prints the
kernels that read or write the draft vocabulary.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_data_path import H, V, VD, smollm2_draft  # noqa: E402  (bench/: puts src/ on the path)

_KERNEL = re.compile(r"(\w+) = async_compile\.triton\('\w+', '''(.*?)'''", re.DOTALL)


def kernels(source: str, vocab: int = VD) -> list[dict]:
    """Inductor's Triton kernels in an output-code `source`: name, kind (poi = pointwise, red/per = reduction),
    exps per element, loads, and whether a store's index has the draft vocabulary's stride."""
    found = []
    for name, body in _KERNEL.findall(source):
        kind = name.split("_")[1] if name.startswith("triton_") else "other"
        stores = [line for line in body.splitlines() if "tl.store(" in line]
        found.append({"name": name, "kind": kind,
                      "exps": body.count("libdevice.exp(") + body.count("tl_math.exp("),
                      "loads": body.count("tl.load("),
                      "stores_vocab_rows": any(re.search(rf"\b{vocab}\b", line) for line in stores),
                      "reads_vocab_rows": bool(re.search(rf"tl\.load\([^\n]*\b{vocab}\b", body))})
    return found


def pretend_h200() -> None:
    """Lets Inductor and Triton write code for cuda:0 with no GPU and no driver. Each patch stands in for one query
    of the device (torch 2.11's internals: another version may ask elsewhere, and then fails loudly)."""
    from torch._inductor import async_compile, compile_fx, scheduler
    from torch._inductor.runtime import hints
    import torch.utils._triton as torch_triton
    from triton.backends.compiler import GPUTarget

    props = hints.DeviceProperties(type="cuda", index=0, multi_processor_count=132, cc=90, major=9,
                                   regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                                   max_threads_per_block=1024, warp_size=32)
    hints.DeviceProperties.create = classmethod(lambda cls, device: props)
    cuda_props = types.SimpleNamespace(major=9, minor=0, multi_processor_count=132, name="NVIDIA H200",
                                       total_memory=141 << 30, regs_per_multiprocessor=65536,
                                       max_threads_per_multi_processor=2048, warp_size=32, L2_cache_size=60 << 20,
                                       shared_memory_per_block_optin=232448, gcnArchName="")
    torch.cuda.get_device_properties = lambda device=None: cuda_props
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.current_device = lambda: 0
    torch.cuda.device_count = lambda: 1
    compile_fx._check_triton_bf16_support = lambda graph: None  # sm_90 has bf16
    scheduler.has_triton = lambda: True  # Triton is installed; it only lacks a driver

    def backend():
        from triton.compiler.compiler import make_backend
        return make_backend(GPUTarget("cuda", 90, 32))

    torch_triton.triton_backend = backend  # Triton's target: sm_90, not the active driver's (there is none)

    class Unbuilt:  # a kernel written, not compiled: this machine cannot, and nothing here runs it
        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    async_compile.AsyncCompile.triton = lambda self, kernel_name, source_code, *args, **kwargs: Unbuilt()


def on_cuda(gm: torch.fx.GraphModule, example_inputs, **kwargs) -> str:
    """Inductor's output code for a copy of `gm` (traced on the CPU) whose factory calls and inputs are on cuda:0."""
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import compile_fx_inner
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    cuda = torch.device("cuda", 0)
    copy = torch.fx.GraphModule(gm, gm.graph.__deepcopy__())
    for node in copy.graph.nodes:
        device = node.kwargs.get("device")
        if device is not None and torch.device(device).type == "cpu":
            node.update_kwarg("device", cuda)
    copy.recompile()
    mode = detect_fake_mode(example_inputs)
    with mode:  # the same symbolic sizes, on cuda:0
        inputs = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=cuda) if isinstance(x, torch.Tensor)
                  else x for x in example_inputs]
        FakeTensorProp(copy, mode).propagate_dont_convert_inputs(*inputs)
        wanted = {k: v for k, v in kwargs.items() if k in ("is_backward", "graph_id", "is_inference")}
        return compile_fx_inner(copy, inputs, **wanted).source_code


def trace(args) -> dict[str, str]:
    """packed_core on bench/'s SmolLM2-shaped draft and a batch of the given sizes, compiled by the trainer's own
    `CompiledUnroll` (its settings); returns each graph's output code for the H200."""
    from functorch.compile import make_boxed_func
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    from draftlab.train.compiled_unroll import CompiledUnroll
    from draftlab.train.packed import PackedPlan, packed_unroll

    code = {}

    def inner(gm, example_inputs, **kwargs):
        code["backward" if kwargs.get("is_backward") else "forward"] = on_cuda(gm, example_inputs, **kwargs)
        return make_boxed_func(gm.forward)  # the CPU runs the graph as traced

    B, T = args.batch, args.seq
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(T // 3, T + 1, (B,), generator=g)
    attention = torch.arange(T)[None] < lengths[:, None]
    answer = attention & (torch.arange(T)[None] >= (lengths * args.prompt_frac).long()[:, None])
    plan = PackedPlan.of(answer, attention, args.ttt_steps)
    model = smollm2_draft()
    batch = {"input_ids": torch.randint(0, V, (B, T), generator=g),
             "features": torch.randn(B, T, 3 * H).bfloat16(), "last_hidden": torch.randn(B, T, H).bfloat16(),
             "loss_mask": answer, "attention_mask": attention,
             "target_top": torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)}
    lm_head = (torch.randn(V, H) * 0.05).bfloat16()
    print(f"kept rows {len(plan.kept)}, teacher rows {len(plan.needed)}, pairs {sum(plan.sizes)}", flush=True)
    # a callable backend gets no Inductor options from CompiledUnroll: its one option, set here
    unroll = CompiledUnroll(backend=lambda gm, inputs: compile_fx(gm, inputs, inner_compile=inner))
    ce = inspect.signature(packed_unroll).parameters["ce"].default  # the eager fallback's loss, an older tree's too
    with inductor_config.patch({"triton.mix_order_reduction": False}), torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = unroll(model, batch, lm_head, plan, args.ttt_steps, 0.8, None, ce)  # bf16 as the trainer, on CPU
    if unroll.failed is not None:
        raise unroll.failed
    loss.backward()
    return code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for forward.py, backward.py and kernels.json")
    ap.add_argument("--batch", type=int, default=16, help="rows (the headline's batches: 16,384 tokens)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--prompt-frac", type=float, default=0.4, help="share of each row before its answer")
    ap.add_argument("--ttt-steps", type=int, default=7)
    args = ap.parse_args()
    if torch.version.cuda is None:
        ap.error(f"torch {torch.__version__} is a CPU build: Inductor writes Triton code for CUDA only with a CUDA "
                 "build (see this file's docstring)")
    pretend_h200()
    code = trace(args)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()}}
    for graph, source in code.items():
        (args.out / f"{graph}.py").write_text(source)
        summary[graph] = kernels(source)
        print(f"{graph}: {len(summary[graph])} kernels; those over the draft vocabulary:")
        for k in summary[graph]:
            if k["reads_vocab_rows"] or k["stores_vocab_rows"]:
                print(f"  {k['kind']:>3} exps {k['exps']:>2} loads {k['loads']:>3} "
                      f"{'stores [rows, vocab] ' if k['stores_vocab_rows'] else ''}{k['name'][:110]}")
    (args.out / "kernels.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""The packed unroll under torch.compile: one graph for the whole draft forward and loss of a training step.

On a GPU the eager step is host-bound: about 1,800 kernel launches a step, queued in ~85 ms while the GPU needs
~44 ms, most of it small elementwise kernels (norms, RoPE, casts, the loss; the matmuls are ~5 ms, by
the trainer's profile). Compiled, the elementwise chains fuse and the host queues far fewer launches.

Every batch has its own sizes (batch rows, length, kept rows, pairs per step), so the graph is built with
dynamic shapes: one forward-and-backward graph, compiled at the first batch and serving every later one (one graph
in the 50,000-sample headline run on the H200). What would make the compiler build more (each build
took 10-150 s on the H200):
- duck sizing, off here: two sizes that happen to be equal in the first batch (say the kept rows and the hidden
  width) would be assumed equal, and the first batch where they differ would recompile;
- the length's remainder modulo 8 (alignment checks): the trainer pads batches to a multiple of 8
  (train/device_batch.py);
- a chunk count (the teacher's draft-vocabulary logits are one matmul: train/ttt.py `teacher_logits`; a pool
  without `target_top`, from before it was stored, forms the full-vocabulary logits in chunks, so its batches run
  eager);
- a batch of one row: dynamic shapes still specialise sizes 0 and 1, so the first one-row batch (the tail of a
  plan window, data/reader.py) built a second graph on the H200 (93 s); such batches run eager;
- Inductor's mix-order reduction fusion, off here: it fuses two reductions only above a size (5 Mi elements, e.g.
  576 x the kept rows), and that test became a guard, so batches on either side of it had graphs of their own
  (seen on the H200 with torch 2.11: 3 graphs in 300 steps; torch/_inductor/scheduler.py, MixOrderReduction).
Python floats (the loss decay) are constants of the graph: traced as symbols, they made the compiler give up its
first trace half-way and start again (dynamo's "Restarting analysis due to ... _tensorify_python_scalars"), which
cost a whole trace on every compile.
The compiled step is host-bound on the H200: the GPU was busy 47% of it, and the forward and the backward each took
about 23 ms of host time to launch ~620 kernels a step (benchmarks/trainer_speed.py --profile). Part of that is
Inductor's Python wrapper working out sizes and grids: `train.compile_cpp_wrapper` has Inductor write the wrapper in
C++ instead, the same kernels and results (tests/unit/test_compiled_unroll.py). On the H200, in one run: 22.35 steps/s
against 18.55 (1.20x, about 9 ms of a 54 ms step), but a cold compile of 186 s against 93. The warm-up builds the
graphs beside generate and extract, and in the headline it finished 18 s before train began with the Python wrapper;
twice its time would put about two minutes on the critical path, where the faster steps save about 55 s in 6,000. So
it is off by default; a longer run, or one with a warm compile cache, gains.
`train.compile_cuda_graphs` removes the launches instead: Inductor's CUDA graph trees record the compiled forward
and backward once and replay them, one launch a graph. A recording holds for one set of sizes (the dynamic graph's
integer inputs), so the trainer pads its batches to a few buckets (train/device_batch.py, `padding_for`; the filler
changes no result: tests/unit/test_packed_unroll.py): at the headline's lengths an epoch has 34 sets of sizes against
727 unpadded, for 1.20x the pairs computed (benchmarks/unroll_sizes.py). Each call starts a new generation of the tree
(`cudagraph_mark_step_begin`) and copies its outputs out of the graphs' memory pool: the trainer keeps the stats past
the next replay. The C++ wrapper is then left out (a replay runs no wrapper; Inductor turns CUDA graphs off with it).
At Llama-3.1-8B's width the padded pairs and the recordings cost more than the launches save, so `auto` records
only for a narrow draft (train/compile_choice.py).
Validation (no grad, the model in eval mode) is a graph of its own: a forward-only one. Eager, it took 86 of the
headline's 366 training seconds (58 passes of 1.5 s; compiled, 2.5x faster), but its compile (73 s cold on the H200)
would sit on the critical path. So it is compiled when the cache is warm, which training's graph tells: the compile
warm-up (warmup/compile.py) builds both beside generate and extract, and an earlier run leaves both. After the
first validation graph, a validation batch that would need another runs eager (`eager_on_recompile`): the passes read
the same batches every time, and one odd batch must not cost a compile. Each compile is logged with its time, so a
recompile in the middle of a run is seen, not guessed from a slow step.

A machine where torch.compile cannot build the graph (no Triton, no C++ compiler) trains with the eager core,
which computes the same loss, gradients and stats (tests/unit/test_compiled_unroll.py), and says so once. The backward
is built with the forward (not lazily at the first backward, where a failure would escape the fallback).
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch
import torch._dynamo
from torch._dynamo import config as dynamo_config
from torch._functorch import config as functorch_config
from torch._inductor import config as inductor_config
from torch.fx.experimental import _config as fx_config

from draftlab.train.packed import packed_core
from draftlab.train.compile_choice import compile_wanted, cuda_graphs_wanted
from draftlab.train.ttt import soft_ce_rows

log = logging.getLogger("draftlab")


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _cache_hits() -> int:
    """Graphs AOTAutograd found in its on-disk cache (compiled by an earlier process, e.g. the compile warm-up)."""
    return torch._dynamo.utils.counters["aot_autograd"]["autograd_cache_hit"]


# Where a build's seconds go, by torch.compile's own timers (torch._dynamo.utils.compilation_time_metrics, the same
# names in torch 2.11 and 2.13): Dynamo tracing the Python, the backend (AOTAutograd and Inductor: a compile, or a
# load from the cache), and within the backend the generated modules' import (on a cache hit nearly all of it). A
# cache hit in the headline still took 11-19 s a graph on the H200: these say which part to shorten.
PHASES = {"trace": "bytecode_tracing", "backend": "OutputGraph.call_user_compiler",
          "modules": "PyCodeCache.load_by_key_path", "guards": "build_guards"}


def _phase_seconds() -> dict[str, float]:
    timers = getattr(torch._dynamo.utils, "compilation_time_metrics", {})  # private: absent means zeros, not a failure
    return {phase: sum(timers.get(name, ())) for phase, name in PHASES.items()}


class CompiledUnroll:
    """`packed_core` under torch.compile (dynamic shapes); the eager core after a failure to build it. Callable as
    `packed_unroll`'s `core`. The loss inside is the plain `soft_ce_rows`, fused into the graph with the rest (the `ce`
    argument, which may be the separately compiled loss, is not traced)."""

    MODES = ("training", "validation")  # grad mode decides: a guard of the graph

    def __init__(self, backend: str = "inductor", validation: bool | None = None, cpp_wrapper: bool = False,
                 cuda_graphs: bool = False) -> None:
        options = {}
        if backend == "inductor" and hasattr(inductor_config.triton, "mix_order_reduction"):
            options["triton.mix_order_reduction"] = False  # its size test is a guard (module docstring)
        self.cuda_graphs = backend == "inductor" and cuda_graphs
        if self.cuda_graphs:  # train.compile_cuda_graphs (module docstring)
            options["triton.cudagraphs"] = True
        elif backend == "inductor" and cpp_wrapper:  # a replayed graph has no wrapper to speed up
            options["cpp_wrapper"] = True  # train.compile_cpp_wrapper (module docstring)
        self._compiled = torch.compile(packed_core, dynamic=True, backend=backend, options=options or None)
        # validation compiled: True, False, or None = once training's graph came from the compile cache. A warm cache
        # (the warm-up's, or an earlier run's) holds validation's graph too; a cold one would put its compile (73 s on
        # the H200) on the critical path, for passes that take 86 s in all eager in the headline
        self.validation = validation
        self.failed: Exception | None = None  # training's graph could not be built: everything runs eager
        self.validation_failed: Exception | None = None  # validation's alone: validation runs eager
        self.mode_seconds = dict.fromkeys(self.MODES, 0.0)  # spent in calls that built a graph, by mode
        self.graphs = 0  # graphs built for the unroll: one for training, one for validation, more are recompiles
        self.built = dict.fromkeys(self.MODES, 0)
        self.hits = dict.fromkeys(self.MODES, 0)  # of those, loaded from the compile cache (warmup/compile.py)
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)  # the builds' seconds by phase (PHASES)

    @property
    def compile_seconds(self) -> float:
        return sum(self.mode_seconds.values())

    def metrics(self) -> dict[str, float]:
        """train/compile_s (seconds in calls that built a graph), train/compile_graphs, train/compile_cache_hits, and
        train/compile_{trace,backend,modules,guards}_s: those seconds by phase (PHASES)."""
        phases = {f"train/compile_{phase}_s": round(seconds, 2) for phase, seconds in self.phase_seconds.items()}
        return {"train/compile_s": round(self.compile_seconds, 2), "train/compile_graphs": float(self.graphs),
                "train/compile_cache_hits": float(sum(self.hits.values())), **phases}

    def _eager(self, mode: str, batch: dict) -> bool:
        """Pools without target_top, one-row batches and what could not be built run eager (module docstring)."""
        if self.failed is not None or "target_top" not in batch or batch["input_ids"].shape[0] < 2:
            return True
        if mode == "validation":
            wanted = self.validation if self.validation is not None else self.hits["training"] > 0
            return not wanted or self.validation_failed is not None
        return False

    def __call__(self, model, batch, lm_head, plan, steps, decay, loss_norm, ce):
        args = (model, batch, lm_head, plan, steps, decay, loss_norm)
        mode = self.MODES[0] if torch.is_grad_enabled() else self.MODES[1]
        if self._eager(mode, batch):
            return packed_core(*args, ce)
        graphs, hits, phases, started = _graphs(), _cache_hits(), _phase_seconds(), time.perf_counter()
        try:
            with contextlib.ExitStack() as settings:
                settings.enter_context(fx_config.patch(use_duck_shape=False))
                settings.enter_context(dynamo_config.patch(specialize_float=True))
                settings.enter_context(_backward_with_forward())
                if mode == "validation" and self.built[mode]:
                    # a second validation graph would serve one odd batch of the few read every pass: run it eager
                    settings.enter_context(torch.compiler.set_stance("eager_on_recompile"))
                if self.cuda_graphs:  # the last step's outputs are dead: this replay may reuse their memory
                    torch.compiler.cudagraph_mark_step_begin()
                out = self._compiled(*args, soft_ce_rows)
                if self.cuda_graphs:  # the trainer keeps the stats past the next replay: copied out of the pool
                    out = tuple(x.clone() for x in out)
        except torch._dynamo.exc.TorchDynamoException as error:  # BackendCompilerFailed, Unsupported, ...
            if mode == "training":
                self.failed = error
            else:
                self.validation_failed = error
            log.warning("train: torch.compile of the unroll failed for %s (%s: %s); %s runs the eager unroll "
                        "(train.compile_unroll=false skips the attempt)", mode, type(error).__name__,
                        str(error)[:300], "everything" if mode == "training" else "validation")
            return packed_core(*args, ce)
        if _graphs() > graphs:
            seconds = time.perf_counter() - started
            self.mode_seconds[mode] += seconds
            self.graphs += 1
            self.built[mode] += 1
            cached = _cache_hits() > hits
            self.hits[mode] += cached
            spent = {phase: after - phases[phase] for phase, after in _phase_seconds().items()}
            for phase, seconds_in_phase in spent.items():
                self.phase_seconds[phase] += seconds_in_phase
            log.info("train: compiled the unroll for %s in %.1f s (graph %d%s%s; Dynamo's trace %.1f s, the backend "
                     "%.1f s of which importing its modules %.1f s, guards %.1f s)", mode, seconds, self.graphs,
                     ", from the compile cache" if cached else "",
                     "" if self.built[mode] == 1 else ": a recompile, TORCH_LOGS=recompiles says why",
                     spent["trace"], spent["backend"], spent["modules"], spent["guards"])
        return out


def _backward_with_forward():
    """AOTAutograd builds a dynamic-shape backward with the forward, but when that fails it only logs and tries again
    at the first backward, outside the fallback's reach; this makes the first failure raise."""
    if hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        return functorch_config.patch(force_non_lazy_backward_lowering=True)
    return contextlib.nullcontext()


def unroll_core_for(choice: str, device: torch.device, cpp_wrapper: bool = False,
                    cuda_graphs: str | bool = False, hidden_size: int = 0) -> CompiledUnroll | None:
    """train.compile_unroll: auto = compiled on CUDA, eager elsewhere (two CPU cores took minutes to compile it);
    None means the eager `packed_core`. cpp_wrapper: train.compile_cpp_wrapper; cuda_graphs:
    train.compile_cuda_graphs for a draft of hidden_size, on CUDA only (there is nothing to record elsewhere)."""
    compiled = compile_wanted("train.compile_unroll", choice, device)
    wanted = cuda_graphs_wanted(cuda_graphs, device, hidden_size)
    graphs = wanted and compiled and device.type == "cuda"
    auto = str(cuda_graphs).lower() == "auto"
    if auto and compiled and device.type == "cuda":
        log.info("train: train.compile_cuda_graphs=auto: %s for a draft of hidden size %d", "on" if graphs else "off",
                 hidden_size)
    if wanted and not graphs and not auto:  # asked for, and nothing to record: say so
        log.warning("train: train.compile_cuda_graphs needs the compiled unroll on CUDA (here %s, %s); training "
                    "without CUDA graphs", device, "compiled" if compiled else "eager")
    if graphs and cpp_wrapper:  # CompiledUnroll leaves it out
        log.warning("train: train.compile_cpp_wrapper is left out under train.compile_cuda_graphs (a replayed graph "
                    "runs no wrapper)")
    return CompiledUnroll(cpp_wrapper=cpp_wrapper, cuda_graphs=graphs) if compiled else None

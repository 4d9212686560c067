"""The real trainer (train/loop.py's Trainer: reads, packed unroll, loss, optimizer, validation, checkpoints) on
synthetic SmolLM2-shaped shards, with its time broken down, against the time it takes only to read its batches.

benchmarks/train_throughput.py times the step alone on tensors already on the device. A sweep's trainer can run well
below that (5.5 steps/s against 17 for the step alone, measured on an H200), so this runs the whole trainer with the
sweep's validation and checkpoint cadence (every 100 steps, 1 in 8 samples held out) and says where its wall time
went: waiting for batches (train/data_wait_frac), validation passes, checkpoint writes, and the rest (the steps,
logging). The synthetic pool is small, so its epochs are short and each epoch's end adds a checkpoint and a cold
read-ahead that the sweep's long epochs amortise: they are in the checkpoint and data-wait columns, not in the rest.

    python benchmarks/trainer_speed.py --device cuda --batch-tokens 16384 --samples 2048 --steps 300
    python benchmarks/trainer_speed.py --device cuda --steps 60 --profile 10 --profile-from 40 --profile-out prof.txt
    python benchmarks/trainer_speed.py --device cpu --batch-tokens 2048 --samples 300 --steps 12 --log-every 4 \
        --eval-every 6 --checkpoint-every 6

`--compile-unroll false` runs the eager unroll (the trainer before train.compile_unroll); the JSON gives the
seconds spent building graphs (`compile_s`: the first step's, and any recompile's) and the rates without them.
`--device-plan` lists the packed rows on the device (the trainer before its host plan). `--plan-in-loop` lists
them on the host but on the training thread (the trainer before its read-ahead worker did it). `--sync-reads` reads
each batch on the training thread instead of the read-ahead worker: a worker building batches in Python takes the
GIL from the thread that launches the step's kernels. `--profile N` records N steps (after the first
`--profile-from`) with torch.profiler, CPU and CUDA, and writes the busiest operators by host and device time.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import types
from concurrent.futures import Future
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import host_load  # noqa: E402
from train_data_path import H, V, smollm2_draft, synthetic_source  # noqa: E402

from draftlab.data import reader  # noqa: E402
from draftlab.util.reporting import RecordingReporter  # noqa: E402
from draftlab.train import device_batch  # noqa: E402
from draftlab.train.loop import LoopSettings, Trainer  # noqa: E402


def timed(totals: dict, name: str, fn):
    """`fn`, adding its wall time to totals[name]."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start
    return wrapper


class InlineExecutor:
    """A ThreadPoolExecutor stand-in that runs each read when it is submitted, on the caller's thread."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        future.set_result(fn(*args))
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


def profiled(trainer: Trainer, start: int, steps: int, out: Path):
    """Starts torch.profiler around `steps` training steps after the first `start`; writes its tables to `out`."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = profile(activities=activities, schedule=schedule(wait=max(start - 5, 0), warmup=min(start, 5),
                                                               active=steps, repeat=1))
    prof.start()
    began: list[float] = []

    def caught_up() -> float:  # the time once the GPU has run what was queued (so steps are timed whole)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_step(step: int) -> None:
        prof.step()
        if step == start:
            began.append(caught_up())
        if step == start + steps:
            wall = caught_up() - began[0] if began else float("nan")
            prof.stop()
            tables = [prof.key_averages().table(sort_by=key, row_limit=30)
                      for key in ("self_cpu_time_total", "self_device_time_total")]
            # the tables' device times count nested ops and overlaps more than once: the GPU's busy share against
            # the wall comes from the trace (benchmarks/trace_summary.py)
            out.write_text(f"{steps} steps from step {start + 1}: {wall * 1e3 / steps:.1f} ms wall a step (profiler "
                           f"on); the GPU's busy share: benchmarks/trace_summary.py "
                           f"{out.with_suffix('.trace.json')}\n\n"
                           + "\n\n".join(tables))
            prof.export_chrome_trace(str(out.with_suffix(".trace.json")))

    trainer.on_step = on_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--per-shard", type=int, default=1024,
                    help="samples a shard (the headline's pool: 1,024, 49 shards; a shuffled batch reads from most)")
    ap.add_argument("--seq", type=int, default=340, help="longest sample; lengths are uniform in [seq/2, seq]")
    ap.add_argument("--prompt-frac", type=float, default=0.4, help="share of each sample outside the loss (ShareGPT: ~0.4)")
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--compile-loss", default="auto")
    ap.add_argument("--compile-unroll", default="auto", help="train.compile_unroll: auto (= on CUDA) | true | false")
    ap.add_argument("--cpp-wrapper", action="store_true", help="train.compile_cpp_wrapper=true")
    ap.add_argument("--cuda-graphs", action="store_true", help="train.compile_cuda_graphs=true")
    ap.add_argument("--count-bucket", type=int, default=None,
                    help="train.graph_count_bucket (under --cuda-graphs; default: batch tokens / 8)")
    ap.add_argument("--compile-validation", action="store_true",
                    help="compile validation's graph even when training's compiled cold (the headline's warm-up "
                         "builds both): later runs then load both from the cache")
    ap.add_argument("--pool", type=Path, default=None,
                    help="keep the synthetic pool in this folder and read it there in later runs (default: a "
                         "temporary one, made again each run)")
    ap.add_argument("--read-batches", type=int, default=20, help="batches timed for the read-only pass")
    ap.add_argument("--sync-reads", action="store_true", help="read batches on the training thread (no worker)")
    ap.add_argument("--read-workers", type=int, default=0,
                    help="threads building the read-ahead batches (reader.READ_WORKERS; 0: the code's own)")
    ap.add_argument("--prefetch", type=int, default=0,
                    help="batches read ahead (reader.PREFETCH; 0: the code's own)")
    ap.add_argument("--device-plan", action="store_true",
                    help="list the packed rows on the device, as before the host plan (host syncs each step)")
    ap.add_argument("--plan-in-loop", action="store_true",
                    help="list the packed rows on the training thread, not on the read-ahead worker")
    ap.add_argument("--profile", type=int, default=0, help="steps to record with torch.profiler (0: none)")
    ap.add_argument("--profile-from", type=int, default=60, help="steps run before the profiled ones")
    ap.add_argument("--profile-out", type=Path, default=Path("trainer_profile.txt"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)  # compiles, passes
    if args.sync_reads:
        reader.ThreadPoolExecutor = InlineExecutor
    if args.read_workers:
        reader.READ_WORKERS = args.read_workers
    if args.prefetch:
        reader.PREFETCH = args.prefetch

    model = smollm2_draft()
    lm_head = torch.randn(V, H) * 0.02
    settings = LoopSettings(max_steps=args.steps, epochs=None, eval_every=args.eval_every, early_stop_patience=None,
                            batch_tokens=args.batch_tokens, log_every=args.log_every,
                            checkpoint_every=args.checkpoint_every, device=args.device, compile_loss=args.compile_loss,
                            compile_unroll=args.compile_unroll, compile_cpp_wrapper=args.cpp_wrapper,
                            compile_cuda_graphs=args.cuda_graphs, graph_count_bucket=args.count_bucket)
    totals = {"data_wait_s": 0.0, "validation_s": 0.0, "checkpoint_s": 0.0}
    with tempfile.TemporaryDirectory(prefix="trainer-speed-") as tmp:
        pool = args.pool or Path(tmp)
        pool.mkdir(parents=True, exist_ok=True)
        source = synthetic_source(pool, args.samples, args.seq, per_shard=args.per_shard,
                                  prompt_frac=args.prompt_frac, val_every=8)
        plan = source._plan("train", 0, args.batch_tokens, settings.max_seq_len, 0, True)[: args.read_batches]
        for group in plan[:2]:  # warm the page cache and the pinned allocator
            source._offline_batch(group, settings.max_seq_len)
        start = time.perf_counter()
        for group in plan[2:]:
            source._offline_batch(group, settings.max_seq_len)
        read_s = (time.perf_counter() - start) / max(len(plan) - 2, 1)

        trainer = Trainer(model, source, lm_head, settings, Path(tmp) / "ckpt", RecordingReporter())
        if args.compile_validation and trainer.core is not None:
            trainer.core.validation = True  # else compiled only once training's graph came from the cache
        log_window = trainer._log_window

        def counting_log_window(t0):  # the window resets the trainer's data wait: take it first
            totals["data_wait_s"] += trainer._data_wait
            return log_window(t0)

        trainer._log_window = counting_log_window
        trainer._validate = timed(totals, "validation_s", trainer._validate)
        trainer._save = timed(totals, "checkpoint_s", trainer._save)
        # the writes run on a thread since 2026-12-04 (train/file_queue.py): _save takes the copies, and the run's
        # last wait for the writes is a checkpoint's cost too, not the steps'
        trainer._files.close = timed(totals, "checkpoint_s", trainer._files.close)
        if args.device_plan:  # the trainer lists no plan; packed_unroll then lists the rows on the device
            device_batch.PackedPlan = types.SimpleNamespace(of=lambda *args: None)
        if args.plan_in_loop:  # prepare attaches nothing: _copy_to_device lists the rows on the training thread
            trainer._attach_plan = lambda batch: batch
        if args.profile:
            profiled(trainer, args.profile_from, args.profile, args.profile_out)
        load_before = host_load.snapshot()  # before the clock starts: the snapshot times its probe
        start = time.perf_counter()
        result = trainer.run()
        wall = time.perf_counter() - start
        load = host_load.shares(load_before, host_load.snapshot())
    tokens = source.num_tokens("train") * result.final["train/epochs_seen"]
    rest = wall - sum(totals.values())
    # every graph built (validation's too once training's came from the cache: train/compiled_unroll.py)
    compile_s = trainer.core.compile_seconds if trainer.core is not None else 0.0
    # training's graph is built inside the steps; validation's, when compiled, inside a validation pass
    training_compile_s = trainer.core.mode_seconds["training"] if trainer.core is not None else 0.0
    print(json.dumps({
        "device": args.device, "batch_tokens": args.batch_tokens, "prompt_frac": args.prompt_frac,
        "samples": args.samples, "shards": len(source.manifest["shards"]),
        "compile_loss": args.compile_loss, "compile_unroll": args.compile_unroll,
        "unroll_compiled": trainer.core is not None and trainer.core.failed is None,
        "unroll_graphs": trainer.core.graphs if trainer.core is not None else 0,
        "packed": trainer.packed, "sync_reads": args.sync_reads,
        "read_workers": reader.READ_WORKERS, "prefetch": reader.PREFETCH,
        "device_plan": args.device_plan, "plan_in_loop": args.plan_in_loop,
        "profiled_steps": args.profile, "compile_validation": args.compile_validation, "threads": torch.get_num_threads(),
        # Inductor's C++ wrapper launches the unroll's kernels without its Python one: --cpp-wrapper sets it for the
        # unroll (train.compile_cpp_wrapper), TORCHINDUCTOR_CPP_WRAPPER=1 for every compile in the process
        "cpp_wrapper": args.cpp_wrapper or bool(inductor_config.cpp_wrapper),
        # train.compile_cuda_graphs: graphs Inductor declined to record (its warning in the log says why)
        "cuda_graphs": args.cuda_graphs, "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
        "count_bucket": trainer.padding.get("counts"),  # the plan's counts padded to a multiple of it (or none)
        "eval_every": args.eval_every, "checkpoint_every": args.checkpoint_every, "steps": result.steps,
        "read_only_s_per_batch": round(read_s, 4), "wall_s": round(wall, 2),
        "steps_per_s": round(result.steps / wall, 2), "tokens_per_s": round(tokens / wall, 1),
        # compiling happens once a run: the rate without it is what a long run converges to
        "compile_s": round(compile_s, 1), "steps_per_s_without_compile": round(result.steps / (wall - compile_s), 2),
        "tokens_per_s_without_compile": round(tokens / (wall - compile_s), 1),
        # compile_s by phase: Dynamo's trace, the backend (a compile or a cache load), its modules' import, guards
        "compile_phases": {k: round(v, 2) for k, v in trainer.core.phase_seconds.items()} if trainer.core else {},
        # the steps alone (the wall less waiting for batches, validation, checkpoints and training's compile): the
        # rate to set beside a step timed alone (benchmarks/train_throughput.py); the whole trainer's is
        # tokens_per_s_without_compile
        "tokens_per_s_in_steps": round(tokens / max(rest - training_compile_s, 1e-9), 1),
        **{k: round(v, 2) for k, v in totals.items()}, "rest_s": round(rest, 2),
        "rest_s_per_step": round(rest / max(result.steps, 1), 4),
        "host_load": load,  # the CPU time stolen by the hypervisor over the run, and busy (benchmarks/host_load.py)
    }), flush=True)


if __name__ == "__main__":
    main()

"""How long the compiled unroll (train/compiled_unroll.py) takes to build, and whether a second process finds it in
the compiler's caches. Each run is one process: the first call's forward and backward on a synthetic batch.

    python benchmarks/compile_time.py --backend aot_eager    # dynamo + AOTAutograd tracing only, SmolLM2-shaped
    TORCHINDUCTOR_CACHE_DIR=/tmp/ind python benchmarks/compile_time.py --backend inductor --small   # twice: cold, warm
    python benchmarks/compile_time.py --code /tmp/old ...    # another checkout (git worktree add /tmp/old REV)

`--small` is a draft of hidden 64 (one layer) (inductor's CPU build of the SmolLM2 shape takes minutes on two
cores). Prints one JSON line: the seconds, the graphs built, AOTAutograd's and Inductor's cache counters (a
"total" of 2 for one graph means dynamo traced it twice; "autograd_cache_bypass" means it could not be stored), and
the build's seconds by phase (`phases`: Dynamo's trace, the backend, its modules' import, the guards), where the
checkout's CompiledUnroll reports them; with `--backend eager`, the traced graph's node count (`fx_nodes`). Where a
trace spends: `python -m cProfile -o /tmp/trace.prof benchmarks/compile_time.py --backend eager`."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout to import")
ap.add_argument("--backend", default="aot_eager", choices=["aot_eager", "inductor", "eager"])
ap.add_argument("--small", action="store_true", help="a small draft instead of the SmolLM2-shaped one")
ap.add_argument("--steps", type=int, default=7, help="TTT steps")
args = ap.parse_args()
scripts = args.code / "benchmarks"
if not scripts.is_dir():  # another checkout may keep these scripts in bench/
    scripts = args.code / "bench"
sys.path.insert(0, str(scripts))  # its train_data_path puts its own src first

import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from train_data_path import H, V, smollm2_draft, synthetic_source  # noqa: E402

from draftlab.model.draft import DraftModelConfig, Eagle3Draft  # noqa: E402
from draftlab.train.compiled_unroll import CompiledUnroll  # noqa: E402
from draftlab.train.device_batch import attach_plan, to_device  # noqa: E402
from draftlab.train.packed import packed_unroll  # noqa: E402

torch.manual_seed(0)
if args.small:
    cfg = DraftModelConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, target_hidden_size=H, vocab_size=V, draft_vocab_size=512,
                           aux_layer_ids=[1, 14, 26], num_hidden_layers=1, max_position_embeddings=4096)
    model = Eagle3Draft(cfg)
else:
    model = smollm2_draft()
lm_head = torch.randn(V, H) * 0.02
with tempfile.TemporaryDirectory(prefix="compile-time-") as tmp:
    source = synthetic_source(Path(tmp), 64, 120, prompt_frac=0.4)
    batch = source._offline_batch(source._plan("train", 0, 2048, 2048, 0, True)[0], 2048)
on_device, plan = to_device(attach_plan(batch, args.steps, 8), torch.device("cpu"), args.steps)
nodes = []


def eager_counting(gm, example_inputs):
    """The `eager` backend (Dynamo's graph run as it is), counting the graph's nodes: a cache hit's trace grows with
    them."""
    nodes.append(len(gm.graph.nodes))
    return gm.forward


core = CompiledUnroll(backend=eager_counting if args.backend == "eager" else args.backend)
start = time.perf_counter()
loss, _ = packed_unroll(model, on_device, lm_head, args.steps, 0.8, plan=plan, core=core)
loss.backward()
seconds = time.perf_counter() - start
print(json.dumps({"code": str(args.code), "backend": args.backend, "small": args.small, "steps": args.steps,
                  "first_call_s": round(seconds, 1), "graphs": core.graphs, "failed": repr(core.failed),
                  "aot_autograd": dict(counters["aot_autograd"]),
                  "fxgraph_cache": {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")},
                  "phases": {k.split("/")[1]: v for k, v in core.metrics().items() if k.endswith("_s")},
                  "fx_nodes": nodes or None, "torch": torch.__version__}))

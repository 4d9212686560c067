# Dynamo's trace of the SmolLM2-shaped unroll alone, under cProfile (a backend that hands the FX graph back):
# its node count, and the profile in /tmp/trace.prof. From the repository root:
#     .venv/bin/python bench/results/cpu_session29_compile_phases/trace_profile.py
import sys, time, cProfile
sys.path.insert(0, "bench")
import torch
from pathlib import Path
import tempfile
from train_data_path import H, V, smollm2_draft, synthetic_source
from draftlab.train.device_batch import attach_plan, to_device
from draftlab.train.packed import packed_core, packed_unroll
from draftlab.train.ttt import soft_ce_rows
from torch._dynamo import config as dynamo_config
from torch.fx.experimental import _config as fx_config
torch.manual_seed(0)
model = smollm2_draft(); lm_head = torch.randn(V, H) * 0.02
with tempfile.TemporaryDirectory() as tmp:
    source = synthetic_source(Path(tmp), 64, 120, prompt_frac=0.4)
    batch = source._offline_batch(source._plan("train", 0, 2048, 2048, 0, True)[0], 2048)
on_device, plan = to_device(attach_plan(batch, 7, 8), torch.device("cpu"), 7)
nodes = []
def backend(gm, example_inputs):
    nodes.append(len(gm.graph.nodes)); return gm.forward
compiled = torch.compile(packed_core, dynamic=True, backend=backend)
class Core:
    def __call__(self, model, batch, lm_head, plan, steps, decay, loss_norm, ce):
        with fx_config.patch(use_duck_shape=False), dynamo_config.patch(specialize_float=True):
            return compiled(model, batch, lm_head, plan, steps, decay, loss_norm, soft_ce_rows)
prof = cProfile.Profile()
t = time.perf_counter(); prof.enable()
loss, _ = packed_unroll(model, on_device, lm_head, 7, 0.8, plan=plan, core=Core())
prof.disable(); print("trace+run s", round(time.perf_counter() - t, 2), "graphs", len(nodes), "nodes", nodes)
prof.dump_stats("/tmp/trace.prof")

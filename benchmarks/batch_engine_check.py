"""The batched engine on a CUDA target, beside the graphed single-request engine in one process (as the bench
stage runs them): per batch size 1, 2, 3 and 6, how many rows give the plain decode's greedy output and the
single-request engine's accept counts, in fp32 (all of them, as tests/unit/test_engine_batch.py checks on the CPU) and
bf16 (a near-tie may flip a token); the graph report; bench/bs4 metrics; the teacher-forced walk against the
engine's verify steps; a sampling run. Prints; asserts nothing.

`python benchmarks/batch_engine_check.py` (a GPU; `--device cpu` runs the same without graphs).
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from draftlab.model.draft import DraftModelConfig, Eagle3Draft  # noqa: E402
from draftlab.serve.batch_bench import measure_batch_size  # noqa: E402
from draftlab.serve.batch_engine import BatchSpecEngine, batch_target_decode  # noqa: E402
from draftlab.serve.batch_runners import BatchEagle3Drafter, BatchTargetRunner  # noqa: E402
from draftlab.serve.engine import SpecEngine, target_decode  # noqa: E402
from draftlab.serve.modes import GRAPHS, STATIC, target_runner  # noqa: E402
from draftlab.serve.static_drafter import StaticEagle3Drafter  # noqa: E402
from draftlab.serve.teacher_forced import pooled, prompt_row  # noqa: E402
from draftlab.target.target import tiny_target  # noqa: E402

PROMPTS = ["Hello there", "What is the capital of France?", "Write a poem about the sea", "abc", "1+1=",
           "Why is the sky blue?"]
K, NEW = 4, 40


def agreeing_draft(t, device, dtype):
    """tests/unit/test_bench_stage.py's draft (the target's last-layer logits, a little attention and MLP noise)."""
    m, H = t.model, t.hidden_size
    cfg = DraftModelConfig(hidden_size=H, intermediate_size=2 * H, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=H // 4, target_hidden_size=H, aux_layer_ids=[1, 3, t.num_layers - 1],
                           vocab_size=t.vocab_size, draft_vocab_size=t.vocab_size,
                           rms_norm_eps=m.config.rms_norm_eps)
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    d2t, t2d = torch.zeros(t.vocab_size, dtype=torch.long), torch.ones(t.vocab_size, dtype=torch.bool)
    with torch.no_grad():
        draft.init_from_target(m.get_input_embeddings().weight.cpu().float(), m.lm_head.weight.cpu().float(),
                               d2t, t2d)
        draft.fc.weight.zero_()
        draft.fc.weight[:, 2 * H:] = torch.eye(H)
        draft.layers[0].self_attn.o_proj.weight.normal_(std=0.02)
        draft.layers[0].mlp.down_proj.weight.normal_(std=0.02)
        draft.norm.weight.copy_(m.model.norm.weight.float())
    return draft.to(device, dtype), tuple(cfg.aux_layer_ids)


def check(device: str, dtype: torch.dtype) -> None:
    t = tiny_target(device=device, dtype=dtype)
    m = t.model
    draft, layers = agreeing_draft(t, device, dtype)
    prompts = [t.chat_ids(p) for p in PROMPTS]
    refs = [target_decode(m, p, NEW, []).tokens for p in prompts]
    mode = GRAPHS if device == "cuda" else STATIC
    drafter = StaticEagle3Drafter(draft, layers, graphs=mode.cuda_graphs)
    single_engine = SpecEngine(m, drafter, K, [], runner=target_runner(m, mode, layers))
    single = [single_engine.generate(p, NEW) for p in prompts]  # first, as in the stage: graphs captured here
    print(dtype, "bs1", mode.name, "rows == plain:", sum(g.tokens == r for g, r in zip(single, refs)), "/ 6",
          single_engine.target.graph_report(), drafter.graph_report())
    engine = BatchSpecEngine(m, BatchEagle3Drafter(draft, layers), K, [])
    for size in (1, 2, 3, 6):
        spec, base = [], []
        for i in range(0, len(prompts), size):
            spec += engine.generate(prompts[i: i + size], NEW)
            base += batch_target_decode(BatchTargetRunner(m), prompts[i: i + size], NEW, [])
        print(dtype, f"bs{size}", "spec == plain:", sum(g.tokens == r for g, r in zip(spec, refs)), "/ 6;",
              "base == plain:", sum(g.tokens == r for g, r in zip(base, refs)), "/ 6;",
              "accepts == bs1 engine:", sum(g.accepted == s.accepted for g, s in zip(spec, single)), "/ 6")
    print(dtype, measure_batch_size(m, drafter, prompts, 4, K, NEW, 0.0, [], 0))
    rows = [prompt_row(m, draft, layers, p, r, K) for p, r in zip(prompts, refs)]
    print(dtype, "walk steps", [r["walk_steps"] for r in rows], "engine", [g.verify_steps for g in single],
          pooled(rows, K))
    gen = torch.Generator(device=device).manual_seed(0)
    print(dtype, "sampling lengths", [len(g.tokens) for g in engine.generate(prompts[:3], 20, 0.8, gen)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.device == "cuda":
        print(torch.__version__, torch.cuda.get_device_name(0))
    for dtype in (torch.float32, torch.bfloat16):
        check(args.device, dtype)


if __name__ == "__main__":
    main()

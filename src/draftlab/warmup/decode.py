"""The decode step's compile built ahead (`data.compile_decode`), in a process of its own while the generate stage
converts the target and tokenises its prompts (started by draftlab/warmup/launch.py whenever generate will
compile its step on a GPU, stopped when generate ends).

The graphs generator compiles one decoder layer and reuses it for every layer (decode_slots.py). That compile took
6.6 s on a cold cache in the 50,000-sample headline run on the H200 and 1.5-2.2 s on a warm one,
and it sits on generate's critical path: its first answers wait for it. The layer's graph depends only on the
target's config, dtype and device and on the stage's shapes (slots, cache columns), not on the weights or the
prompts, so a model of one layer built from the target's config (read without its weights: generate may be
converting them) compiles the same graph into torch.compile's on-disk cache, where the stage then finds it. The
stage's `generate/decode_compile_cached` says whether it did.

    python -m draftlab warm-decode CONFIG.yaml RESULT.json    (CONFIG: a job's resolved config)
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from draftlab.util import fsutil
from draftlab.generation.decode_slots import DecodeSlots, cache_columns, slot_attention
from draftlab.target.target import resolve_device, resolve_dtype
from draftlab.warmup.launch import exit_with_parent, target_config

log = logging.getLogger("draftlab")


def one_layer_target(cfg) -> torch.nn.Module:
    """The target's architecture with one decoder layer and random weights, on its device and dtype, set up as the
    generate stage sets up the real one (stages/generate.py: eager attention outside fp32)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = target_config(cfg.target, Path(cfg.paths.root) / "models")
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:1]
    device = resolve_device(cfg.target.device)
    dtype = resolve_dtype(cfg.target.dtype, device)
    with torch.device(device):  # its weights made there, not on the host that generate is tokenising on
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    if dtype != torch.float32:
        model.set_attn_implementation("eager")
    return model


def warm_decode(cfg) -> dict[str, float]:
    """Compiles the decode step's layer at the generate stage's shapes into the compile cache; returns
    decode_compile_s and warmup_s. Raises when the compile fails (the stage then compiles, or falls back, itself)."""
    started = time.perf_counter()
    data = cfg.data
    model = one_layer_target(cfg)  # its weights made outside inference mode, as the stage's target's are
    new_tokens = int(data.max_new_tokens)
    columns = cache_columns(int(data.max_prompt_tokens), new_tokens)  # as generate_graphs sizes the ring
    # the slots and the step in inference mode, as generate_graphs runs them; the end-of-turn and pad ids do not
    # enter the compiled layer
    with torch.inference_mode(), slot_attention(model):
        slots = DecodeSlots(model, int(data.batch_size), columns, new_tokens, eos_ids=[0], pad_id=0, compile=True)
        slots.compile_step()
    if not slots.compiled:
        raise RuntimeError("torch.compile of the decode step failed (the log above says why)")
    return {"decode_compile_s": round(slots.compile_seconds, 2), "warmup_s": round(time.perf_counter() - started, 2)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m draftlab warm-decode", description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path, help="a job's resolved config (YAML)")
    ap.add_argument("result", type=Path, help="where the metrics go (JSON, written when the step is compiled)")
    args = ap.parse_args(argv)
    exit_with_parent()
    result = warm_decode(OmegaConf.load(args.config))
    fsutil.atomic_write_json(args.result, result)
    log.info("decode compile warm-up: %s", result)
    return 0

"""Stage `generate`: the target answers the prompts; its answers are the draft's training data.

The output folder is a pool shared by every `data.samples`: a run makes sure the first N samples (plus
`data.val_samples`, the fixed validation set made first) exist and
generates only the missing ones, shard by shard. Batches always start at multiples of `data.batch_size` and are
seeded by their first index, so a resumed or extended run writes exactly what an uninterrupted one would (the
pool may hold up to one batch more than asked for). The whole-shard generators (continuous, graphs) answer whole
shards only (up to a shard more), so a shard's answers never depend on how many samples the first run asked for.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path

import torch

from draftlab.data.prompts import Prompt, load_prompts, split_for, usable_pool
from draftlab.data.pool import pool_size
from draftlab.data.samples import Sample, SampleWriter, count_samples, read_manifest, read_samples
from draftlab.util.progress import bar
from draftlab.provenance.provenance import file_sha256
from draftlab.plan.stage_keys import data_sha256, plan
from draftlab.generation.plain import generate_batch
from draftlab.target.target import Target, load_target

log = logging.getLogger("draftlab.generate")
WHOLE_SHARD = ("continuous", "graphs")  # generators that take a whole shard and keep batch_size rows in flight


def run(cfg, out: Path, inputs: dict[str, Path], reporter) -> dict[str, float]:
    data = cfg.data
    # names the settings, code and prompt file of the pool
    fingerprint = plan(cfg, upto="generate")["generate"].folder_key
    _reset_if_foreign(out, fingerprint)
    have, need = count_samples(out), pool_size(data)
    if have >= need:
        log.info("generate: %d samples already in %s, nothing to do", have, out)
        return _summary(out, need, new=0, seconds=0.0)

    prompts = load_prompts(data.source, data.path, data.seed)
    reporter.tag("data.source_file", prompts.source)
    source_sha = file_sha256(Path(prompts.source))
    if source_sha != data_sha256(cfg):  # the pool's key named the file as it was when this stage was planned
        raise RuntimeError(f"data.path: {prompts.source} changed while this job ran; rerun it")
    reporter.tag("data.source_sha256", source_sha)
    engine = None
    if data.engine == "server":  # a running SGLang/vLLM answers; only the tokenizer is loaded here
        from draftlab.serve.remote import ServerEngine

        engine = ServerEngine(cfg, out)
        target = engine.target
    else:
        target = load_target(cfg.target, Path(cfg.paths.root) / "models")
        if target.dtype != torch.float32 and data.generator != "continuous":
            # bf16/fp16 + sdpa + left padding yields garbage rows on CPU (stack-notes 3); eager is correct.
            target.model.set_attn_implementation("eager")
    try:
        return _generate(cfg, out, target, engine, prompts, fingerprint, have, need)
    finally:
        if engine is not None:
            engine.close()
        if data.generator == "graphs":  # its KV cache and CUDA graph must not outlive the stage
            from draftlab.generation.graphgen import release

            release()


def _generate(cfg, out: Path, target, engine, prompts, fingerprint: str, have: int, need: int) -> dict[str, float]:
    data = cfg.data
    # continuous and graphs refill rows over a whole shard; greedy only (fastgen.py and graphgen.py say why)
    whole_shard = data.generator in WHOLE_SHARD and data.temperature == 0
    if data.generator in WHOLE_SHARD and not whole_shard:
        log.warning("generate: data.generator=%s is greedy only; sampling uses the plain path", data.generator)
    if data.compile_decode and not (whole_shard and data.generator == "graphs" and engine is None):
        log.warning("generate: data.compile_decode compiles the graphs generator's decode step; this run decodes "
                    "another way (data.generator=%s, data.engine=%s), so it does nothing", data.generator, data.engine)
    writer = SampleWriter(out, fingerprint, meta={"target": target.fingerprint, "source": prompts.source,
                                                  "records_read": prompts.records_read})
    # whole batches only; whole shards for the whole-shard generators, whose schedule (which rows share a prefill)
    # would otherwise depend on data.samples, and with it a bf16 answer (docs/tracking.md)
    unit = data.shard_size if whole_shard else data.batch_size
    goal = -(-need // unit) * unit
    # every prompt of the pool tokenised before any is answered, so that a file with too few usable prompts is
    # refused now, not after the shards before the shortfall (on the H200: 50,000 asked of 49,916, after 80 s)
    usable = usable_pool(target.tokenizer, prompts.prompts, data, goal)
    if len(usable) < need:
        raise ValueError(f"data.samples: {need} asked (data.val_samples included), but {prompts.source} has only "
                         f"{len(usable)} prompts within data.max_prompt_tokens={data.max_prompt_tokens}")
    tokenized = iter(usable[have:])  # the first samples exist: their prompts are skipped
    started, new_tokens, first = time.perf_counter(), 0, have
    progress = bar(goal - have, "generate", "sample")  # moves per batch, not per shard
    # A shard's samples are built (answers decoded to text) and written on a thread while the next shard is
    # answered, so the GPU waits for neither: 16,384 samples take seconds of host time. Shards are written in
    # order, one at a time; leaving the block (an error included) waits for the one being written.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="draftlab-sample-writer") as pool:
        written = None
        while first < need:
            size = min(data.shard_size - first % data.shard_size, goal - first)
            batch = list(islice(tokenized, size))  # the last batch may be short: the file ran out past data.samples
            answers = _answer_shard(target, data, first, batch, whole_shard, progress.update, engine)
            if written is not None:
                written.result()  # re-raises the previous shard's write error
            written = pool.submit(_write_shard, writer, target, data, first, batch, answers)
            first += len(batch)
            new_tokens += sum(len(answer) for answer in answers)
            progress.set_postfix(tok_s=f"{new_tokens / (time.perf_counter() - started):.0f}")
        if written is not None:
            written.result()
    progress.close()
    seconds = time.perf_counter() - started
    summary = _summary(out, min(need, writer.num_samples), new=writer.num_samples - have, seconds=seconds)
    summary["generate/tokens_per_s"] = new_tokens / max(seconds, 1e-9)
    if data.generator == "graphs":
        from draftlab.generation.graphgen import compile_metrics

        summary.update(compile_metrics())  # data.compile_decode: the compile's seconds, and whether it was cached
    return summary


def _reset_if_foreign(out: Path, fingerprint: str) -> None:
    """A folder made with other settings (possible under DVC's fixed paths) is emptied, never mixed."""
    manifest = read_manifest(out) if out.exists() else None
    if manifest and manifest["fingerprint"] != fingerprint:
        log.warning("generate: %s was made with other settings; starting it over", out)
        for path in out.glob("shard-*"):
            path.unlink()
        (out / "manifest.json").unlink()


def _write_shard(writer: SampleWriter, target: Target, data, first: int, items: list[tuple[Prompt, list[int]]],
                 answers: list[list[int]]) -> None:
    writer.write_shard(_samples(target, data, first, items, answers))


def _answer_shard(target: Target, data, first: int, items: list[tuple[Prompt, list[int]]],
                  whole_shard: bool = False, on_batch=None, engine=None) -> list[list[int]]:
    """The answers to a shard's prompts, in order."""
    prompts = [ids for _, ids in items]
    if engine is not None:  # the server answers the whole shard, data.server.concurrency requests at a time
        answers = engine.answer(prompts, first, data)
    elif whole_shard:  # continuous, graphs: one call refills up to batch_size rows (fastgen.py, graphgen.py)
        answers = _answer_whole_shard(target, data, prompts)
    else:
        return _answer_batches(target, data, first, prompts, on_batch)
    if on_batch is not None:
        on_batch(len(items))
    return answers


def _answer_whole_shard(target: Target, data, prompts: list[list[int]]) -> list[list[int]]:
    if data.generator == "graphs":
        from draftlab.generation.graphgen import generate_graphs

        return generate_graphs(target, prompts, data.max_new_tokens, data.batch_size, data.max_prompt_tokens,
                               compile=data.compile_decode)
    from draftlab.generation.fastgen import generate_continuous

    return generate_continuous(target, prompts, data.max_new_tokens, data.batch_size)


def _answer_batches(target: Target, data, first: int, prompts: list[list[int]], on_batch=None) -> list[list[int]]:
    """data.batch_size prompts at a time, each batch seeded by its first index."""
    answers = []
    for start in range(0, len(prompts), data.batch_size):
        chunk = prompts[start:start + data.batch_size]
        torch.manual_seed(data.seed * 1_000_003 + first + start)  # sampling depends on the batch, not on history
        if data.generator == "static":
            from draftlab.generation.fastgen import generate_static

            answers += generate_static(target, chunk, data.max_new_tokens, data.temperature, data.max_prompt_tokens)
        else:
            answers += generate_batch(target, chunk, data.max_new_tokens, data.temperature)
        if on_batch is not None:
            on_batch(len(chunk))
    return answers


def _samples(target: Target, data, first: int, items: list[tuple[Prompt, list[int]]],
             answers: list[list[int]]) -> list[Sample]:
    samples = []
    for offset, ((prompt, ids), answer) in enumerate(zip(items, answers)):
        text = target.tokenizer.decode(answer, skip_special_tokens=True)
        samples.append(Sample(
            index=first + offset,
            input_ids=torch.tensor(ids + answer, dtype=torch.long),
            loss_mask=torch.tensor([False] * len(ids) + [True] * len(answer)),
            split=split_for(prompt.conversation_id, data.val_fraction),
            prompt=prompt.text, response=text, conversation_id=prompt.conversation_id,
        ))
    return samples


def _summary(out: Path, samples: int, new: int, seconds: float) -> dict[str, float]:
    """Counts over the first `samples` samples, the ones later stages use."""
    answer_tokens = total_tokens = 0
    for sample in read_samples(out, limit=samples):
        answer_tokens += int(sample.loss_mask.sum())
        total_tokens += len(sample.input_ids)
    return {"generate/samples": samples, "generate/new_samples": new, "generate/tokens": answer_tokens,
            "generate/total_tokens": total_tokens, "generate/pool_samples": count_samples(out),
            "generate/seconds_generating": seconds}

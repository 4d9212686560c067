"""The fast generation paths (data.generator=static, graphs, continuous) give the plain path's greedy answers in fp32,
with rows ending early and refilled; graphs' decode step reads nothing back to the host (so it can be captured);
and the hardware presets compose."""

import logging
from pathlib import Path

import pytest
import torch

from draftlab.config.config import ConfigError, validate
from draftlab.data.samples import read_samples
import draftlab.generation.graphgen as graphgen
from draftlab.generation.decode_slots import slot_attention
from draftlab.generation.fastgen import generate_continuous, generate_static
from draftlab.generation.graphgen import generate_graphs
from draftlab.util.reporting import RecordingReporter
from draftlab.stages import generate
from draftlab.stages.generate import generate_batch
from draftlab.target.target import tiny_target
from conftest import compose_config
from fake_cuda import Dispatched, FakeCuda


def _prompts(n=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (int(torch.randint(3, 24, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _ending_early(target, prompts):
    """Sets an end-of-turn token the random model does produce, so rows end at different steps and free their
    slot; returns the plain path's answers."""
    free = generate_batch(target, prompts, max_new_tokens=16, temperature=0.0)
    counts = torch.bincount(torch.tensor([t for a in free for t in a[1:8]]))
    target.model.generation_config.eos_token_id = int(counts.argmax())
    plain = generate_batch(target, prompts, max_new_tokens=16, temperature=0.0)
    lengths = {len(a) for a in plain}
    assert len(lengths) > 1 and min(lengths) < 16  # some rows end early: their slots are refilled
    return plain


def test_continuous_equals_plain_in_fp32_with_early_ends_and_refill():
    target = tiny_target()
    prompts = _prompts()
    plain = _ending_early(target, prompts)
    fast = generate_continuous(target, prompts, max_new_tokens=16, slots=3)  # 10 prompts through 3 rows
    assert fast == plain
    static = generate_static(target, prompts, max_new_tokens=16, temperature=0.0, width=40)  # padded past the longest
    assert static == plain


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("slots,refill", [(2, 0.0), (3, 0.25), (5, 1.0), (16, 0.25)])
def test_graphs_equals_plain_in_fp32_with_early_ends_refills_and_ring_wraps(attention, slots, refill):
    target = tiny_target()
    target.model.set_attn_implementation(attention)  # the prefill uses the model's own attention
    prompts = _prompts(12, seed=1)
    plain = _ending_early(target, prompts)
    assert len({len(p) for p in prompts}) > 4  # prompts of many lengths, left padded in the prefill
    fast = generate_graphs(target, prompts, max_new_tokens=16, slots=slots, width=40, refill=refill, check_every=3)
    assert fast == plain
    state = graphgen._slots
    assert state.batch == min(slots, len(prompts)) and state.columns == 64  # 40 + 16, a multiple of 16
    if slots == 2:  # 12 prompts through 2 slots: the ring of 64 columns wrapped at least once
        assert state.steps > state.columns
    assert target.model.config._attn_implementation == attention  # restored
    assert not any(hasattr(layer.self_attn, "_draftlab_slot_ring") for layer in target.model.model.layers)
    assert graphgen.decode_mode() == "eager"  # a CPU runs the step eagerly


@pytest.mark.slow  # inductor compiles the tiny step (~30 s cold on 2 cores)
def test_graphs_compiled_step_equals_plain_in_fp32():
    from torch._dynamo.utils import counters

    target = tiny_target()
    prompts = _prompts(12, seed=1)
    plain = _ending_early(target, prompts)
    graphs_before = counters["stats"]["unique_graphs"]
    assert generate_graphs(target, prompts, max_new_tokens=16, slots=3, width=40, compile=True) == plain
    assert graphgen.decode_mode() == "eager+compiled"  # it did compile, not fall back
    # one decoder layer compiled, reused by all 8 (regional compilation): a graph per layer would cost 8 compiles
    assert counters["stats"]["unique_graphs"] - graphs_before == 1
    assert not any("forward" in vars(layer) for layer in target.model.model.layers)  # the prefill's is the model's


def test_graphs_falls_back_to_the_plain_step_when_compile_fails(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("inductor: no compiler here")

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: broken)
    target = tiny_target()
    prompts = _prompts(6, seed=3)
    plain = generate_batch(target, prompts, max_new_tokens=8, temperature=0.0)
    assert generate_graphs(target, prompts, max_new_tokens=8, slots=4, width=24, compile=True) == plain
    assert graphgen.decode_mode() == "eager"
    assert "torch.compile of the decode step failed (RuntimeError: inductor: no compiler here)" in caplog.text


def test_graphs_first_token_ends_and_single_token_answers():
    target = tiny_target()
    prompts = _prompts(6, seed=2)
    first = [a[0] for a in generate_batch(target, prompts, max_new_tokens=1, temperature=0.0)]
    assert generate_graphs(target, prompts, 1, slots=4, width=24) == [[t] for t in first]
    target.model.generation_config.eos_token_id = first[0]  # an answer that ends at its first token
    plain = generate_batch(target, prompts, max_new_tokens=8, temperature=0.0)
    assert plain[0] == [first[0]]
    assert generate_graphs(target, prompts, 8, slots=4, width=24) == plain
    with pytest.raises(ValueError, match="data.max_prompt_tokens"):
        generate_graphs(target, prompts, 8, slots=4, width=3)
    target.model.generation_config.repetition_penalty = 1.3  # plain generate would apply it: refused, not ignored
    with pytest.raises(ValueError, match="repetition_penalty"):
        generate_graphs(target, prompts, 8, slots=4, width=24)


def test_graphs_one_token_prompts_and_a_failed_step_leave_the_model_as_it_was(monkeypatch):
    """A one-token prompt's prefill has a one-token query, like a decode step: only the ring a step hangs on each
    attention module tells them apart. A step that fails half-way must still take the rings off again, or the
    next prefill would write into them."""
    target = tiny_target()
    prompts = [[7], [300], *_prompts(4, seed=4), [42]]
    plain = generate_batch(target, prompts, max_new_tokens=6, temperature=0.0)
    assert generate_graphs(target, prompts, max_new_tokens=6, slots=3, width=24) == plain

    layer = target.model.model.layers[5]
    broken = {"armed": True}
    real_mlp = layer.mlp.forward

    def fails_once(hidden):
        if hasattr(layer.self_attn, "_draftlab_slot_ring") and broken.pop("armed", False):  # inside a step, once
            raise RuntimeError("a kernel failed")
        return real_mlp(hidden)

    monkeypatch.setattr(layer.mlp, "forward", fails_once)
    graphgen.release()
    with pytest.raises(RuntimeError, match="a kernel failed"):
        generate_graphs(target, prompts, max_new_tokens=6, slots=3, width=24)
    assert not any(hasattr(layer.self_attn, "_draftlab_slot_ring") for layer in target.model.model.layers)
    assert generate_graphs(target, prompts, max_new_tokens=6, slots=3, width=24) == plain


# ops that read a device value back to the host, or copy host data in: either one breaks a CUDA graph capture
HOST_ROUND_TRIPS = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "equal", "masked_select", "lift_fresh",
                    "lift_fresh_copy", "_unique2", "unique_consecutive", "tolist"}


def test_graphs_decode_step_never_reads_back_to_the_host():
    target = tiny_target()
    generate_graphs(target, _prompts(4), max_new_tokens=4, slots=4, width=24)
    state = graphgen._slots
    buffers = [t.data_ptr() for t in (state.tokens, state.positions, state.mask, state.out, state.done,
                                      state.keys[0])]
    with torch.inference_mode(), slot_attention(target.model):
        with Dispatched() as seen:
            state.step()
        assert {"scaled_dot_product_attention", "index_copy_", "argmax"} <= seen.ops  # the mode saw the step
        assert not seen.ops & HOST_ROUND_TRIPS, seen.ops & HOST_ROUND_TRIPS
        # a replayed graph repeats the captured kernels with their captured scalars: the step must not bake in
        # host values that change from step to step (ring column, positions, step count)
        state.load([1], [[5, 6, 7, 8, 9]])
        state.advance(5)
        with Dispatched() as later:
            state.step()
        assert later.calls == seen.calls
        with Dispatched() as check:  # and it does see a read-back where there is one
            state.done.any().item()
        assert check.ops & HOST_ROUND_TRIPS
    # the step writes into its static buffers in place: a graph replays the same addresses
    assert buffers == [t.data_ptr() for t in (state.tokens, state.positions, state.mask, state.out, state.done,
                                              state.keys[0])]


def _samples(folder, n=None):
    return [(s.index, s.input_ids.tolist(), s.loss_mask.tolist(), s.split) for s in read_samples(folder, limit=n)]


def test_stage_with_each_fast_generator_writes_the_plain_samples(tiny_cfg, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="draftlab.generate")
    plain, fast = tmp_path / "plain", tmp_path / "fast"
    generate.run(validate(tiny_cfg("data.samples=12", "data.shard_size=8", "data.batch_size=4")), plain, {},
                 RecordingReporter())
    metrics = generate.run(validate(tiny_cfg("data.samples=12", "data.shard_size=8", "data.batch_size=4",
                                             "data.generator=continuous")), fast, {}, RecordingReporter())
    assert metrics["generate/new_samples"] == 16 and metrics["generate/samples"] == 12  # whole shards of 8
    assert _samples(fast, 12) == _samples(plain)
    for generator in ("static", "graphs"):
        generate.run(validate(tiny_cfg("data.samples=12", "data.shard_size=8", "data.batch_size=4",
                                       f"data.generator={generator}")), tmp_path / generator, {}, RecordingReporter())
        assert _samples(tmp_path / generator, 12) == _samples(plain), generator
    assert "graphs: cpu device, so the decode step runs eagerly" in caplog.text  # the graphs path did run
    assert graphgen._slots is None  # and the stage released its cache and graph


def test_stage_passes_compile_decode_to_graphs_and_warns_where_it_does_nothing(tiny_cfg, tmp_path, caplog,
                                                                                 monkeypatch):
    seen = []

    def recording(*args, compile=False, **kwargs):  # the flag as the stage passes it; decoded uncompiled here
        seen.append(compile)
        return generate_graphs(*args, **kwargs)

    monkeypatch.setattr(graphgen, "generate_graphs", recording)
    settings = ("data.samples=8", "data.shard_size=4", "data.batch_size=4")
    for compile_decode in (True, False):
        generate.run(validate(tiny_cfg(*settings, "data.generator=graphs", f"data.compile_decode={compile_decode}")),
                     tmp_path / f"graphs-{compile_decode}", {}, RecordingReporter())
    assert seen == [True, True, False, False]  # every shard, as configured
    caplog.set_level(logging.WARNING, logger="draftlab.generate")
    generate.run(validate(tiny_cfg(*settings, "data.compile_decode=true")), tmp_path / "plain", {}, RecordingReporter())
    assert "data.compile_decode compiles the graphs generator's decode step" in caplog.text
    assert _samples(tmp_path / "plain") == _samples(tmp_path / "graphs-True")


def test_graphs_refuses_a_target_split_over_devices():
    with pytest.raises(ConfigError, match="data.generator: graphs needs the target on one device"):
        validate(compose_config(["data.generator=graphs", "target.device_map=auto"]))


def test_hardware_presets_compose():
    cpu = validate(compose_config())
    assert cpu.hardware.name == "cpu" and cpu.data.generator == "plain" and cpu.train.batch_tokens == 4096
    gpu = validate(compose_config(["hardware=gpu", "data.samples=50000"]))
    assert gpu.hardware.name == "gpu" and gpu.data.generator == "graphs" and gpu.data.samples == 50000
    assert gpu.target.dtype == "bfloat16" and gpu.data.shard_size % gpu.data.batch_size == 0
    assert gpu.train.batch_tokens > cpu.train.batch_tokens
    # the GPU recipe trains to convergence (issue 10): early stopping, with max_steps only as a cap
    assert gpu.train.schedule == "wsd" and gpu.train.early_stop_patience and gpu.train.max_steps
    smoke = validate(compose_config(["hardware=gpu", "experiment=smoke"]))  # a named experiment still wins
    assert smoke.target.name == "tiny"
    assert Path(__file__).parents[2].joinpath("conf", "hardware", "gpu.yaml").exists()


def _capture_cpu_slots_as_if_on_a_gpu(monkeypatch) -> None:
    """DecodeSlots.capture runs its GPU path (under FakeCuda) on slots that live on the CPU."""
    from draftlab.generation.decode_slots import DecodeSlots

    capture_on_gpu = DecodeSlots.capture

    def capture(self):
        device, self.device = self.device, torch.device("cuda")
        try:
            capture_on_gpu(self)
        finally:
            self.device = device

    monkeypatch.setattr(DecodeSlots, "capture", capture)


def test_graphs_failed_capture_decodes_eagerly_on_the_callers_stream(monkeypatch, caplog):
    """A capture that fails (a host sync inside it) leaves torch.cuda.graph's capture stream current, since its
    exit raises before restoring it: the fallback must put the caller's stream back and still give plain's answers."""
    from draftlab.generation.decode_slots import DecodeSlots

    target = tiny_target()
    prompts = _prompts(6, seed=3)
    plain = generate_batch(target, prompts, max_new_tokens=8, temperature=0.0)
    fake = FakeCuda(monkeypatch)
    step = DecodeSlots.step

    def syncing_step(self):
        if fake.current == "capture":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        step(self)

    monkeypatch.setattr(DecodeSlots, "step", syncing_step)
    _capture_cpu_slots_as_if_on_a_gpu(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="draftlab.generate"):
        assert generate_graphs(target, prompts, max_new_tokens=8, slots=4, width=24) == plain
    assert fake.current == "default" and graphgen.decode_mode() == "eager"
    assert "CUDA graph capture failed" in caplog.text


def test_graphs_refuses_a_graph_that_replays_nothing(monkeypatch, caplog):
    """A capture on another device than the model's records nothing (the step's kernels run eagerly, outside the
    graph); replaying it would never finish a slot. The capture checks that a replay moves the ring on, and decodes
    eagerly when it does not."""
    target = tiny_target()
    prompts = _prompts(6, seed=3)
    plain = generate_batch(target, prompts, max_new_tokens=8, temperature=0.0)
    fake = FakeCuda(monkeypatch)  # its graphs record nothing and replay nothing
    _capture_cpu_slots_as_if_on_a_gpu(monkeypatch)
    monkeypatch.setattr(graphgen, "_slots", None)
    with caplog.at_level(logging.WARNING, logger="draftlab.generate"), torch.inference_mode(), \
            slot_attention(target.model):
        graphgen._decode_slots(target, 4, 32, 8, False)
    assert graphgen.decode_mode() == "eager" and "replays nothing" in caplog.text  # else: decoding forever
    assert generate_graphs(target, prompts, max_new_tokens=8, slots=4, width=24) == plain
    assert fake.current == "default"


def test_graphs_frees_its_slots_when_released_or_replaced():
    """The kept slots (a KV cache for every slot, the graph's memory pool) must really go when the stage releases
    them or a shard of another shape replaces them, not when Python's collector gets round to the cycle they form."""
    import weakref

    target = tiny_target()
    prompts = _prompts(6, seed=3)
    generate_graphs(target, prompts, max_new_tokens=4, slots=4, width=24)
    old = weakref.ref(graphgen._slots)
    generate_graphs(target, prompts[:2], max_new_tokens=4, slots=4, width=24)  # 2 slots: a new set
    assert old() is None
    kept = weakref.ref(graphgen._slots)
    graphgen.release()
    assert kept() is None

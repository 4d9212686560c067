"""The fast generation paths (data.generator=static, continuous) give the plain path's greedy answers in fp32, with rows
ending early and refilled; and the hardware presets compose."""

from pathlib import Path

import torch

from draftlab.config import validate
from draftlab.data.samples import read_samples
from draftlab.fastgen import generate_continuous, generate_static
from draftlab.reporting import RecordingReporter
from draftlab.stages import generate
from draftlab.stages.generate import generate_batch
from draftlab.target import tiny_target
from conftest import compose_config


def _prompts(n=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (int(torch.randint(3, 24, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def test_continuous_equals_plain_in_fp32_with_early_ends_and_refill():
    target = tiny_target()
    prompts = _prompts()
    free = generate_batch(target, prompts, max_new_tokens=16, temperature=0.0)
    # an end-of-turn token the random model does produce, so rows end at different steps and free their slot
    counts = torch.bincount(torch.tensor([t for a in free for t in a[1:8]]))
    target.model.generation_config.eos_token_id = int(counts.argmax())
    plain = generate_batch(target, prompts, max_new_tokens=16, temperature=0.0)
    lengths = {len(a) for a in plain}
    assert len(lengths) > 1 and min(lengths) < 16  # some rows end early: their slots are refilled below
    fast = generate_continuous(target, prompts, max_new_tokens=16, slots=3)  # 10 prompts through 3 rows
    assert fast == plain
    static = generate_static(target, prompts, max_new_tokens=16, temperature=0.0, width=40)  # padded past the longest
    assert static == plain


def _samples(folder):
    return [(s.index, s.input_ids.tolist(), s.loss_mask.tolist(), s.split) for s in read_samples(folder)]


def test_stage_with_the_continuous_generator_writes_the_plain_samples(tiny_cfg, tmp_path):
    plain, fast = tmp_path / "plain", tmp_path / "fast"
    generate.run(validate(tiny_cfg("data.samples=12", "data.shard_size=8", "data.batch_size=4")), plain, {},
                 RecordingReporter())
    metrics = generate.run(validate(tiny_cfg("data.samples=12", "data.shard_size=8", "data.batch_size=4",
                                             "data.generator=continuous")), fast, {}, RecordingReporter())
    assert metrics["generate/new_samples"] == 12
    assert _samples(fast) == _samples(plain)
    generate.run(validate(tiny_cfg("data.samples=12", "data.shard_size=8", "data.batch_size=4",
                                   "data.generator=static")), tmp_path / "static", {}, RecordingReporter())
    assert _samples(tmp_path / "static") == _samples(plain)


def test_hardware_presets_compose():
    cpu = validate(compose_config())
    assert cpu.hardware.name == "cpu" and cpu.data.generator == "plain" and cpu.train.batch_tokens == 4096
    gpu = validate(compose_config(["hardware=gpu", "data.samples=50000"]))
    assert gpu.hardware.name == "gpu" and gpu.data.generator == "static" and gpu.data.samples == 50000
    assert gpu.target.dtype == "bfloat16" and gpu.data.shard_size % gpu.data.batch_size == 0
    assert gpu.train.batch_tokens > cpu.train.batch_tokens
    # the GPU recipe trains to convergence (issue 10): early stopping, with max_steps only as a cap
    assert gpu.train.schedule == "wsd" and gpu.train.early_stop_patience and gpu.train.max_steps
    smoke = validate(compose_config(["hardware=gpu", "experiment=smoke"]))  # a named experiment still wins
    assert smoke.target.name == "tiny"
    assert Path(__file__).parents[1].joinpath("conf", "hardware", "gpu.yaml").exists()

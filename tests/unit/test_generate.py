"""The generate stage: batched answers equal one-at-a-time ones, growth and resume lose or repeat nothing."""

from pathlib import Path

import pytest
import torch

from draftlab.config.config import validate
from draftlab.data.samples import count_samples, read_samples
from draftlab.util.reporting import RecordingReporter
from draftlab.stages import generate
from draftlab.stages.generate import generate_batch
from draftlab.target.target import tiny_target


def _samples(folder, n=None):
    return [(s.index, s.input_ids.tolist(), s.loss_mask.tolist(), s.split) for s in read_samples(folder, limit=n)]


@pytest.mark.parametrize("dtype, attn", [(torch.float32, "sdpa"), (torch.bfloat16, "eager")])
def test_batched_generation_equals_one_at_a_time(dtype, attn):
    target = tiny_target(dtype=dtype)
    target.model.set_attn_implementation(attn)
    prompts = [target.chat_ids(text) for text in ("hi", "a much longer prompt than the first", "mid size one")]
    batched = generate_batch(target, prompts, max_new_tokens=12, temperature=0.0)
    single = [generate_batch(target, [p], max_new_tokens=12, temperature=0.0)[0] for p in prompts]
    assert batched == single


def _run(cfg, folder: Path):
    return generate.run(cfg, folder, {}, RecordingReporter())


def test_more_samples_generate_only_the_new_ones(tiny_cfg, tmp_path):
    cfg16 = validate(tiny_cfg("data.samples=16"))
    folder = tmp_path / "pool"
    first = _run(cfg16, folder)
    assert first["generate/new_samples"] == 16 and first["generate/samples"] == 16
    before = _samples(folder)
    again = _run(cfg16, folder)
    assert again["generate/new_samples"] == 0
    grown = _run(validate(tiny_cfg("data.samples=32")), folder)
    assert grown["generate/new_samples"] == 16
    assert _samples(folder, 16) == before  # the first N are reused unchanged


def test_killed_run_resumes_without_losing_or_repeating(tiny_cfg, tmp_path, monkeypatch):
    cfg = validate(tiny_cfg("data.samples=48"))
    reference = tmp_path / "reference"
    _run(cfg, reference)

    folder = tmp_path / "killed"
    real = generate._answer_shard
    calls = {"n": 0}

    def dies_on_second_shard(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(generate, "_answer_shard", dies_on_second_shard)
    with pytest.raises(KeyboardInterrupt):
        _run(cfg, folder)
    assert count_samples(folder) == 16  # the first shard survived, nothing half-written is listed
    monkeypatch.setattr(generate, "_answer_shard", real)
    resumed = _run(cfg, folder)
    assert resumed["generate/new_samples"] == 32
    assert _samples(folder) == _samples(reference)


def test_a_shard_write_error_stops_the_stage_and_names_the_file(tiny_cfg, tmp_path, monkeypatch):
    """Shards are written on a thread while the next is answered: its error must still fail the stage."""
    real_answer = generate._answer_shard
    answered = {"n": 0}

    def full_disk(*args):
        raise OSError(28, "No space left on device", "shard-00000.safetensors")

    def counting(*args, **kwargs):
        answered["n"] += 1
        return real_answer(*args, **kwargs)

    monkeypatch.setattr(generate, "_write_shard", full_disk)
    monkeypatch.setattr(generate, "_answer_shard", counting)
    with pytest.raises(OSError, match="shard-00000"):
        _run(validate(tiny_cfg("data.samples=48")), tmp_path / "full")
    assert answered["n"] == 2  # it stopped at the next shard, not after answering all three


def test_sampling_is_reproducible_and_independent_of_history(tiny_cfg, tmp_path):
    cfg8 = validate(tiny_cfg("data.samples=8", "data.temperature=1.0"))
    cfg16 = validate(tiny_cfg("data.samples=16", "data.temperature=1.0"))
    stepwise, direct = tmp_path / "a", tmp_path / "b"
    _run(cfg8, stepwise)
    _run(cfg16, stepwise)
    _run(cfg16, direct)
    assert _samples(stepwise) == _samples(direct)


def test_answers_hold_the_assistant_mask_and_text(tiny_cfg, tmp_path):
    cfg = validate(tiny_cfg("data.samples=8"))
    _run(cfg, tmp_path / "p")
    sample = next(read_samples(tmp_path / "p", with_text=True))
    answer = sample.input_ids[sample.loss_mask]
    assert 0 < len(answer) <= cfg.data.max_new_tokens
    assert not sample.loss_mask[: sample.prompt_len].any() and sample.loss_mask[sample.prompt_len:].all()
    assert sample.prompt


def test_too_few_usable_prompts_is_an_error_naming_the_key(tiny_cfg, tmp_path):
    import json

    path = tmp_path / "few.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"question {i}"}) for i in range(5)))
    cfg = validate(tiny_cfg("data.source=jsonl", f"data.path={path}", "data.samples=16"))
    with pytest.raises(ValueError, match="data.samples: 16 asked"):
        _run(cfg, tmp_path / "pool")


def test_a_shortfall_of_usable_prompts_is_refused_before_any_is_answered(tiny_cfg, tmp_path):
    """12 short prompts and 4 over data.max_prompt_tokens, 16 asked in shards of 4: the first three shards could be
    answered before the shortfall shows; the stage counts first and answers none (it once failed after 80 s)."""
    import json

    path = tmp_path / "mixed.jsonl"
    texts = [f"question {i}" for i in range(12)] + [" ".join(["word"] * 200)] * 4
    path.write_text("\n".join(json.dumps({"prompt": text}) for text in texts))
    cfg = validate(tiny_cfg("data.source=jsonl", f"data.path={path}", "data.samples=16", "data.max_prompt_tokens=32",
                            "data.batch_size=4", "data.shard_size=4"))
    with pytest.raises(ValueError, match="only 12 prompts within data.max_prompt_tokens=32"):
        _run(cfg, tmp_path / "pool")
    assert count_samples(tmp_path / "pool") == 0


def test_the_pool_tokenised_in_chunks_gives_each_prompt_its_own_ids():
    """usable_prompts encodes prompts in batched chunks; the ids and the choice equal the one-at-a-time path's."""
    from draftlab.data.prompts import Prompt
    from draftlab.target.target import tiny_tokenizer, usable_prompts

    tok = tiny_tokenizer()
    prompts = [Prompt("word " * (i % 13) + f"prompt {i}", f"c{i}") for i in range(300)]

    def one(text):
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
        return tok(rendered, add_special_tokens=False)["input_ids"]

    lengths = [len(one(p.text)) for p in prompts]
    limit_tokens = sorted(lengths)[len(lengths) // 2]  # about half the prompts are too long
    expected = [(p, one(p.text)) for p, n in zip(prompts, lengths) if n <= limit_tokens][:100]
    assert len(expected) == 100
    for chunk in (7, 64, 2048):  # chunks that end inside, at and past the limit
        assert usable_prompts(tok, prompts, limit_tokens, 100, chunk=chunk) == expected
    assert len(usable_prompts(tok, prompts, limit_tokens, 10_000)) == sum(n <= limit_tokens for n in lengths)


def test_whole_shard_generators_answer_a_shard_alike_whatever_was_asked_first(tiny_cfg, tmp_path, monkeypatch):
    """Which prompts share a prefill decides a bf16 answer (docs/tracking.md): a pool first asked for fewer samples
    than a shard must still hand the generator the whole shard, as a pool asked for more does."""
    from draftlab.generation import fastgen

    calls = []
    real = fastgen.generate_continuous

    def recording(target, prompts, *args, **kwargs):
        calls.append([tuple(p) for p in prompts])
        return real(target, prompts, *args, **kwargs)

    monkeypatch.setattr(fastgen, "generate_continuous", recording)
    settings = ("data.shard_size=16", "data.batch_size=4", "data.generator=continuous")
    small = _run(validate(tiny_cfg("data.samples=6", *settings)), tmp_path / "small")
    small_calls, calls[:] = list(calls), []
    _run(validate(tiny_cfg("data.samples=24", *settings)), tmp_path / "large")
    assert small_calls[0] == calls[0] and len(small_calls[0]) == 16
    assert small["generate/samples"] == 6 and count_samples(tmp_path / "small") == 16
    assert _samples(tmp_path / "small") == _samples(tmp_path / "large", 16)

"""The embedded SmolLM2 target: converted once from its GGUF, answers coherently through the generate path."""

import pytest

from conftest import compose_config
from draftlab.config.config import validate
from draftlab.generation.plain import generate_batch
from draftlab.target.target import SMOLLM2_SHAPE, load_target

pytestmark = pytest.mark.smollm2


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a real model: both cores pay off (conftest sets 1 for the tiny one)
    cfg = validate(compose_config(["target.dtype=float32", "target.device=cpu"]))
    yield load_target(cfg.target, tmp_path_factory.mktemp("models"))
    torch.set_num_threads(threads)


def test_shape_matches_what_preflight_assumes(smollm2):
    assert {key: getattr(smollm2.config, key) for key in SMOLLM2_SHAPE} == SMOLLM2_SHAPE
    assert smollm2.eos_token_ids == [2]


def test_answers_real_prompts_batched(smollm2):
    questions = ["What is the capital of France?", "Give me three tips for staying healthy.", "Say hello."]
    answers = generate_batch(smollm2, [smollm2.chat_ids(q) for q in questions], max_new_tokens=24, temperature=0.0)
    texts = [smollm2.tokenizer.decode(a, skip_special_tokens=True) for a in answers]
    assert "Paris" in texts[0]
    assert all(len(a) > 3 for a in answers)
    alone = generate_batch(smollm2, [smollm2.chat_ids(questions[0])], max_new_tokens=24, temperature=0.0)
    assert alone[0] == answers[0]

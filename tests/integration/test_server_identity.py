"""data.engine=server with a server someone else started: a server that says it serves another model is named in a
warning, and one that answers ids outside the target's vocabulary stops the stage (a silent wrong-model pool would
otherwise be extracted with the target's hidden states)."""

import logging

import pytest

from draftlab.config.config import validate
from draftlab.util.reporting import RecordingReporter
from draftlab.serve.remote import ServerError, warn_if_not_the_target
from draftlab.stages import generate


def _cfg(tiny_cfg, url: str):
    return validate(tiny_cfg("data.samples=8", "data.engine=server", f"data.server.url='{url}'",
                             "data.server.concurrency=2"))


@pytest.mark.parametrize("api", ["sglang", "vllm"])
def test_a_server_of_another_model_is_named(api, standin, tiny_cfg, tmp_path, caplog):
    url = standin("--api", api, "--model", "/models/Qwen2.5-7B-Instruct")
    with caplog.at_level(logging.WARNING, logger="draftlab"):
        generate.run(_cfg(tiny_cfg, url), tmp_path / "pool", {}, RecordingReporter())
    assert f"{url} serves '/models/Qwen2.5-7B-Instruct', but the target is 'tiny'" in caplog.text


def test_the_targets_own_server_is_not_warned_about(standin, tiny_cfg, tmp_path, caplog):
    url = standin("--api", "sglang", "--model", "/data/ckpt/TINY")
    with caplog.at_level(logging.WARNING, logger="draftlab"):
        generate.run(_cfg(tiny_cfg, url), tmp_path / "pool", {}, RecordingReporter())
    assert "serves" not in caplog.text


def test_ids_outside_the_vocabulary_stop_the_stage(standin, tiny_cfg, tmp_path):
    url = standin("--api", "vllm", "--id-offset", "100000")
    with pytest.raises(ServerError, match=rf"{url} answered token id \d+ for sample 0, outside the vocabulary"):
        generate.run(_cfg(tiny_cfg, url), tmp_path / "pool", {}, RecordingReporter())


def test_names_match_on_the_last_part_either_way(caplog):
    with caplog.at_level(logging.WARNING, logger="draftlab"):
        warn_if_not_the_target("/models/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "u")
        warn_if_not_the_target("SmolLM2-135M-Instruct", "smollm2", "u")
        warn_if_not_the_target(None, "anything", "u")  # nothing said: nothing to compare
    assert caplog.text == ""
    with caplog.at_level(logging.WARNING, logger="draftlab"):
        warn_if_not_the_target("/models/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "u")
    assert "Llama-3.1-70B-Instruct" in caplog.text


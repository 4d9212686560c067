"""The SGLang command line built from serve.*: explicit speculative parameters, current flag names, refusals."""

import pytest

from draftlab.config.config import default_config
from draftlab.sglang.launch import LaunchError, build_baseline_argv, build_server_argv, spec_params
from sglang_fixtures import write_draft


def serve(**overrides):
    return default_config({"serve": {"backend": "sglang", **overrides}}).serve


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_speculative_argv(tmp_path):
    draft = write_draft(tmp_path / "d")
    argv = build_server_argv(serve(python="/venv/bin/python", cuda_graph_max_bs=64, mem_fraction_static=0.8,
                                   tp_size=2), "/models/target", draft, port=31000)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    assert argv[:3] == ["/venv/bin/python", "-m", "sglang.launch_server"]
    assert flag(argv, "--speculative-algorithm") == "EAGLE3"
    assert flag(argv, "--speculative-draft-model-path") == str(draft)
    assert (flag(argv, "--speculative-num-steps"), flag(argv, "--speculative-eagle-topk"),
            flag(argv, "--speculative-num-draft-tokens")) == ("4", "1", "5")
    assert flag(argv, "--host") == "127.0.0.1" and flag(argv, "--port") == "31000"
    assert flag(argv, "--dtype") == "bfloat16" and flag(argv, "--tp-size") == "2"
    assert flag(argv, "--mem-fraction-static") == "0.8"
    assert flag(argv, "--cuda-graph-max-bs-decode") == "64"
    assert "--cuda-graph-max-bs" not in argv and "--disable-cuda-graph" not in argv


def test_baseline_has_no_speculation_and_graphs_can_be_disabled():
    argv = build_baseline_argv(serve(cuda_graph=False), "/models/target")
    assert not any(a.startswith("--speculative") for a in argv)
    assert flag(argv, "--cuda-graph-backend-decode") == "disabled"
    assert flag(argv, "--cuda-graph-backend-prefill") == "disabled"


@pytest.mark.parametrize("algorithm", ["EAGLE", "NEXTN", "eagle"])
def test_eagle_or_nextn_with_an_eagle3_draft_is_refused(tmp_path, algorithm):
    with pytest.raises(LaunchError, match="accept length 1.0"):
        build_server_argv(serve(algorithm=algorithm), "/t", write_draft(tmp_path / "d"))


def test_other_algorithms_and_non_eagle3_drafts_are_refused(tmp_path):
    with pytest.raises(LaunchError, match="serve.algorithm"):
        build_server_argv(serve(algorithm="STANDALONE"), "/t", write_draft(tmp_path / "d"))
    plain = write_draft(tmp_path / "p", config_patch={"architectures": ["LlamaForCausalLM"]})
    with pytest.raises(LaunchError, match="not an SGLang EAGLE-3 class"):
        build_server_argv(serve(), "/t", plain)


@pytest.mark.parametrize("overrides, message", [
    ({"num_steps": 3, "topk": 1, "num_draft_tokens": 8}, "must be num_steps \\+ 1 = 4"),
    ({"num_steps": 3, "topk": 4}, "required when serve.topk"),
    ({"num_steps": 2, "topk": 2, "num_draft_tokens": 16}, "2 .. num_steps \\* topk \\+ 1 = 5"),
])
def test_inconsistent_speculative_parameters(overrides, message):
    with pytest.raises(LaunchError, match=message):
        spec_params(serve(**overrides))


def test_tree_parameters_pass():
    assert spec_params(serve(num_steps=5, topk=4, num_draft_tokens=8)) == (5, 4, 8)


@pytest.mark.parametrize("extra, message", [
    (["--cuda-graph-max-bs", "8"], "--cuda-graph-max-bs-decode"),
    (["--disable-cuda-graph"], "cuda-graph-backend-decode disabled"),
    (["--port=1234"], "set from serve"),
])
def test_extra_args_cannot_override_or_use_retired_flags(tmp_path, extra, message):
    with pytest.raises(LaunchError, match=message):
        build_server_argv(serve(extra_args=extra), "/t", write_draft(tmp_path / "d"))


def test_extra_args_are_appended(tmp_path):
    argv = build_server_argv(serve(extra_args=["--max-running-requests", "8"]), "/t", write_draft(tmp_path / "d"))
    assert argv[-2:] == ["--max-running-requests", "8"]

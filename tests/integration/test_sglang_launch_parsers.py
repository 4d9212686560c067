"""draftlab's exact launch command lines, parsed and resolved by each supported SGLang release's own argument parser
(pytest -m sglang): 0.5.23 is the sglang venv's package, 0.5.17 its source unpacked beside the venv
(scripts/sglang-source.sh), run by the same interpreter with that folder first on PYTHONPATH."""

import inspect

import pytest

from draftlab.config.config import default_config
from draftlab.sglang.capture import shipped_versions
from draftlab.sglang.contract import run_probe, server_argv_for_probe, sglang_python, sglang_sources
from draftlab.sglang.launch import build_baseline_argv, build_server_argv
from sglang_fixtures import write_draft, write_target

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.skipif(sglang_python() is None, reason="no sglang venv: run scripts/setup-sglang.sh "
                       "(or set DRAFTLAB_SGLANG_PYTHON) to run the SGLang contract tests"),
]

# Where launch.py takes the serving release (a `version` parameter), each release's own command line is checked;
# without one, its single command line is checked against 0.5.23, whose flags it writes, and 0.5.17 through the
# GPU flags below
VERSIONED = "version" in inspect.signature(build_server_argv).parameters
LAUNCH_VERSIONS = shipped_versions() if VERSIONED else ["0.5.23"]
# The flags benchmarks/gpu's launch line passes on the GPU machine (shared/reference/sglang-gpu/README.md), and the
# cuda-graph flags of either spelling
GPU_FLAGS = {
    "--attention-backend": ["triton"], "--sampling-backend": ["pytorch"], "--grammar-backend": ["none"],
    "--mm-feature-transport": ["cpu"], "--disable-cuda-graph": [], "--cuda-graph-max-bs": ["16"],
    "--decode-log-interval": ["1"], "--cuda-graph-max-bs-decode": ["16"],
    "--cuda-graph-backend-decode": ["disabled", "--cuda-graph-backend-prefill", "disabled"],
}
# What each release's parser does with them: 0.5.23 dropped the --cuda-graph-max-bs alias, so argparse finds it
# ambiguous (the -decode and -prefill flags) and exits 2
REJECTED = {"0.5.17": set(), "0.5.23": {"--cuda-graph-max-bs"}}


def _source(version: str) -> str | None:
    sources = sglang_sources()
    assert version in sources, f"no SGLang {version} source: run scripts/setup-sglang.sh"
    return sources[version][1]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch")
    return write_target(root / "target"), write_draft(root / "draft")


def _launch_jobs(version: str, target, draft) -> dict[str, list[str]]:
    by_version = {"version": version} if VERSIONED else {}
    cfg = default_config({"serve": {"backend": "sglang", "num_steps": 3, "topk": 1, "cuda_graph_max_bs": 32}})
    no_graph = default_config({"serve": {"backend": "sglang", "cuda_graph": False}})
    return {
        "spec": build_server_argv(cfg.serve, target, draft, decode_log_interval=1, **by_version),
        "baseline": build_baseline_argv(cfg.serve, target, **by_version),
        "no_graph": build_server_argv(no_graph.serve, target, draft, **by_version),
    }


@pytest.mark.parametrize("version", LAUNCH_VERSIONS)
def test_each_release_resolves_our_launch_command_lines(version, folders):
    jobs = _launch_jobs(version, *folders)
    results = dict(zip(jobs, run_probe([{"kind": "args", "argv": server_argv_for_probe(argv)}
                                        for argv in jobs.values()], pythonpath=_source(version))))
    for name, result in results.items():
        assert result["ok"], (version, name, result)
        assert result["version"] == version, name  # the release asked for, not the venv's own
    spec = results["spec"]["resolved"]
    assert (spec["speculative_algorithm"], spec["speculative_num_steps"], spec["speculative_eagle_topk"],
            spec["speculative_num_draft_tokens"]) == ("EAGLE3", 3, 1, 4)
    assert spec["speculative_draft_model_path"] == str(folders[1]) and spec["model_path"] == str(folders[0])
    assert spec["dtype"] == "bfloat16" and spec["host"] == "127.0.0.1" and spec["decode_log_interval"] == 1
    assert spec["cuda_graph_config"]["decode"]["max_bs"] == 32
    assert results["baseline"]["resolved"]["speculative_algorithm"] is None
    graphs = results["no_graph"]["resolved"]["cuda_graph_config"]
    assert graphs["decode"]["backend"] == graphs["prefill"]["backend"] == "disabled"


@pytest.mark.parametrize("version", sorted(REJECTED))
def test_which_gpu_launch_flags_each_release_accepts(version, folders):
    """Parsed and resolved one flag at a time, on top of a plain speculative launch."""
    target, draft = folders
    plain = ["--model-path", str(target), "--dtype", "bfloat16", "--speculative-algorithm", "EAGLE3",
             "--speculative-draft-model-path", str(draft), "--speculative-num-steps", "3",
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    jobs = [{"kind": "args", "argv": plain + [flag, *values]} for flag, values in GPU_FLAGS.items()]
    results = dict(zip(GPU_FLAGS, run_probe(jobs, pythonpath=_source(version))))
    rejected = {flag for flag, result in results.items() if not result["ok"]}
    assert rejected == REJECTED[version], {flag: results[flag].get("error") for flag in rejected}
    assert all(r["version"] == version for r in results.values() if r["ok"])
    resolved = {flag: r["resolved"] for flag, r in results.items() if r["ok"]}
    assert resolved["--attention-backend"]["attention_backend"] == "triton"
    assert resolved["--mm-feature-transport"]["mm_feature_transport"] == "cpu"
    assert resolved["--decode-log-interval"]["decode_log_interval"] == 1
    for flag in ("--disable-cuda-graph", "--cuda-graph-backend-decode"):  # the deprecated spelling and the current one
        graphs = resolved[flag]["cuda_graph_config"]
        assert graphs["decode"]["backend"] == graphs["prefill"]["backend"] == "disabled", flag
    for flag in {"--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"} - REJECTED[version]:
        assert resolved[flag]["cuda_graph_config"]["decode"]["max_bs"] == 16, flag

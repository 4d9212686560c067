"""Contract tests against the REAL sglang 0.5.23 package (separate venv from scripts/setup-sglang.sh).

SGLang's own argument parser checks our command lines; SGLang's own LlamaForCausalLMEagle3.load_weights
(on the meta device) checks our exported checkpoints, and `keymap` must predict exactly what it does.
All jobs run in ONE subprocess: importing sglang takes ~20 s on a 2-core machine.
"""

import pytest

from draftlab.config.config import default_config
from draftlab.sglang import keymap
from draftlab.sglang.contract import run_probe, server_argv_for_probe, sglang_python
from draftlab.sglang.launch import build_baseline_argv, build_server_argv
from draftlab.sglang.st_files import read_headers
from sglang_fixtures import write_draft, write_target

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.skipif(sglang_python() is None, reason="no sglang venv: run scripts/setup-sglang.sh "
                       "(or set DRAFTLAB_SGLANG_PYTHON) to run the SGLang contract tests"),
]

DRAFTS = {
    "good": {},
    "two_layers_old_norm_name": {"num_layers": 2,  # the norm a later layer reads, saved under Llama's name
                                 "rename": lambda k: k.replace("layers.1.hidden_norm", "layers.1.input_layernorm")},
    "two_layers": {"num_layers": 2},
    "midlayer_names": {"rename": lambda k: k.replace("layers.0.", "midlayer.")},
    "foreign_prefix": {"rename": lambda k: "draft_model." + k if k == "fc.weight" else k},
    "tied": {"config_patch": {"tie_word_embeddings": True}},
    "no_lm_head": {"drop": ("lm_head.weight",)},
}


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    import torch

    root = tmp_path_factory.mktemp("contract")
    target = write_target(root / "target")
    folders = {name: write_draft(root / name, **kw) for name, kw in DRAFTS.items()}
    folders["single_layer_fc"] = write_draft(root / "single_layer_fc", replace={"fc.weight": torch.randn(16, 16)})
    cfg = default_config({"serve": {"backend": "sglang", "num_steps": 3, "topk": 1, "cuda_graph_max_bs": 32}})
    spec = server_argv_for_probe(build_server_argv(cfg.serve, target, folders["good"], decode_log_interval=1))
    base = server_argv_for_probe(build_baseline_argv(cfg.serve, target))
    no_graph = server_argv_for_probe(build_server_argv(default_config({"serve": {"cuda_graph": False}}).serve, target,
                                                       folders["good"]))
    bad_ndt = [a if a != "4" or spec[i - 1] != "--speculative-num-draft-tokens" else "8" for i, a in enumerate(spec)]
    args_jobs = {"spec": spec, "baseline": base, "no_graph": no_graph,
                 "retired_flag": spec + ["--cuda-graph-max-bs", "8"], "bad_ndt": bad_ndt}
    jobs = [{"kind": "args", "argv": argv} for argv in args_jobs.values()]
    jobs += [{"kind": "weights", "draft": str(folder)} for folder in folders.values()]
    results = run_probe(jobs)
    names = list(args_jobs) + list(folders)
    return dict(zip(names, results)), folders


def test_sglang_parses_and_resolves_our_speculative_command(probe):
    results, _ = probe
    spec = results["spec"]
    assert spec["ok"], spec
    r = spec["resolved"]
    assert (r["speculative_algorithm"], r["speculative_num_steps"], r["speculative_eagle_topk"],
            r["speculative_num_draft_tokens"]) == ("EAGLE3", 3, 1, 4)
    assert r["dtype"] == "bfloat16" and r["host"] == "127.0.0.1" and r["decode_log_interval"] == 1
    assert r["cuda_graph_config"]["decode"]["max_bs"] == 32
    assert results["baseline"]["ok"] and results["baseline"]["resolved"]["speculative_algorithm"] is None
    no_graph = results["no_graph"]
    assert no_graph["ok"], no_graph
    assert no_graph["resolved"]["cuda_graph_config"]["decode"]["backend"] == "disabled"


def test_sglang_confirms_the_rules_launch_enforces(probe):
    results, _ = probe
    assert not results["retired_flag"]["ok"]  # --cuda-graph-max-bs: ambiguous, argparse exits 2
    assert "exit 2" in results["retired_flag"]["error"]
    assert results["bad_ndt"]["resolved"]["speculative_num_draft_tokens"] == 4  # silently rewritten


def _compare_with_keymap(result: dict, folder) -> keymap.KeyReport:
    import json

    config = json.loads((folder / "config.json").read_text())
    report = keymap.map_keys({k: v["shape"] for k, v in read_headers(folder).items()}, config)
    assert sorted(report.dropped) == result["keys_not_consumed"]
    for param, writes in result["written"].items():
        for key, shard in writes:
            assert report.landed[key].param == param, key
    predicted_unwritten = {p for p in keymap.expected_params(config) if not any(
        land.param == p for land in report.landed.values())}
    assert predicted_unwritten == set(result["never_written"])
    expected = keymap.expected_params(config)
    assert set(expected) == set(result["params"])
    for param, shape in expected.items():  # vocab rows are padded to a multiple of 64 in memory
        if param not in ("model.embed_tokens.weight", "lm_head.weight"):
            assert tuple(result["params"][param]) == shape, param
    return report


def test_good_export_every_tensor_consumed_every_parameter_written(probe):
    results, folders = probe
    good = results["good"]
    assert good["ok"], good
    assert good["keys_not_consumed"] == []
    assert set(good["never_written"]) <= {"model.embed_tokens.weight"}
    assert good["hot_token_id"][0] >= 0 and good["hot_token_id"][1] < 64 and good["hot_token_id"][2] == 32
    assert _compare_with_keymap(good, folders["good"]).ok


def test_keymap_predicts_sglang_on_faulty_exports(probe):
    results, folders = probe
    for name in ("two_layers_old_norm_name", "midlayer_names", "foreign_prefix", "tied", "no_lm_head"):
        assert results[name]["ok"], (name, results[name])
        _compare_with_keymap(results[name], folders[name])
    assert results["two_layers_old_norm_name"]["never_written"] == ["model.layers.1.hidden_norm.weight"]
    # our own two-layer export: only the inherited input_layernorm that SGLang's later layers never read
    assert set(results["two_layers"]["never_written"]) <= {"model.embed_tokens.weight",
                                                           "model.layers.1.input_layernorm.weight"}
    assert "draft_model.fc.weight" in results["foreign_prefix"]["keys_not_consumed"]
    assert "lm_head.weight" in results["tied"]["keys_not_consumed"]
    assert "lm_head.weight" in results["no_lm_head"]["never_written"]
    assert results["midlayer_names"]["keys_not_consumed"] == []


def test_single_layer_fc_fails_sglang_shape_assert(probe):
    results, _ = probe
    bad = results["single_layer_fc"]
    assert not bad["ok"] and "fc.weight" in bad["error"]

"""The features extracted for layer ids are what each family's SGLang class captures for them (its capture
contract), checked against the model's own per-layer outputs; and the whole chain on each family's tiny target."""

import json

import pytest
import torch

from draftlab.data.features import HiddenTap
from draftlab.data.layers import capture_points, resolve_layers
from draftlab.sglang.capture import for_target
from draftlab.target.target import load_target
from family_targets import FAMILIES, PIPELINE_FAMILIES, save_family

HF = {"name": "hf", "gguf_file": None, "dtype": "float32", "device": "cpu", "device_map": None}
# SGLang's id rules as the contract read them from its model files: which stream each id list names
EXPECTED = {"plus1": {(1, 2, 4): [2, 3, 5], (2, 3, 4): [3, 4, 5]},
            "plus1_if_first_is_1": {(1, 2, 4): [2, 3, 5], (2, 3, 4): [2, 3, 4]},
            "as_is_if_max_is_L": {(1, 2, 4): [2, 3, 5], (2, 3, 4): [3, 4, 5]}}


def target_cfg(folder):
    from omegaconf import OmegaConf

    return OmegaConf.create({**HF, "path": str(folder)})


@pytest.mark.parametrize("family", FAMILIES)
def test_features_are_the_streams_sglang_captures(family, tmp_path):
    folder = save_family(family, tmp_path / family)
    capture = for_target(json.loads((folder / "config.json").read_text()))
    assert family != "kimi_k25" or capture.wraps == "DeepseekV3ForCausalLM"
    target = load_target(target_cfg(folder), tmp_path / "models")
    L, H = target.num_layers, target.hidden_size
    ids_in = torch.randint(3, 300, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        streams = target.model.model(input_ids=ids_in, output_hidden_states=True).hidden_states
    for ids in ([1, 2, 4], [2, 3, 4]):
        ids = resolve_layers(ids, L, capture)
        points = capture_points(ids, ids, L, capture)
        assert points == EXPECTED[capture.rule][tuple(ids)], (family, capture.rule)
        features, _ = HiddenTap(target.model, ids, points)(ids_in, None, torch.float32)
        for j, c in enumerate(points):
            assert torch.allclose(features[..., j * H:(j + 1) * H], streams[c], atol=1e-5), (family, ids, c)


def test_auto_is_each_familys_sglang_default():
    for arch in ("LlamaForCausalLM", "DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration",
                 "Qwen3MoeForCausalLM", "GptOssForCausalLM", "Glm4MoeForCausalLM"):
        capture = for_target({"architectures": [arch]})
        for L in (30, 61):
            assert capture.points(capture.default_ids(L), L) == [2, L // 2, L - 3], arch


@pytest.mark.slow
@pytest.mark.parametrize("family", PIPELINE_FAMILIES)
def test_whole_chain_then_check_draft_with_no_flags(family, tiny_cfg, tmp_path, capsys):
    from draftlab.sglang.check import check_draft_main
    from draftlab.task import run_task

    folder = save_family(family, tmp_path / family)
    cfg = tiny_cfg("target=hf", f"target.path={folder}", "target.dtype=float32", "target.device=cpu",
                   "extract.layers=[2,3,4]", "data.samples=12", "train.max_steps=2", "train.epochs=1",
                   "bench.prompts=1", "bench.max_new_tokens=4", "tracking.enabled=false",
                   "bench.tau_fail=0")  # a draft trained 2 steps on a random target may well accept nothing
    metrics = run_task(cfg)
    assert metrics["train/steps"] >= 1 and "bench/tau" in metrics
    from draftlab.config.config import validate
    from draftlab.pipeline import plan

    draft = plan(validate(cfg))["train"].folder / "draft"
    manifest = json.loads((plan(validate(cfg))["extract"].folder / "manifest.json").read_text())
    capture = for_target(json.loads((folder / "config.json").read_text()))
    assert manifest["capture_points"] == capture.points([2, 3, 4], 6)
    capsys.readouterr()
    assert check_draft_main([str(draft)]) == 0
    out = capsys.readouterr()
    assert "by hand" not in out.out + out.err and "WARNING eagle_config" not in out.out + out.err

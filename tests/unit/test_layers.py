"""extract.layers: SGLang's capture convention, and refusals that happen before any weights are read."""

import json
import logging

import pytest

from draftlab.config.config import ConfigError, default_config
from draftlab.data import layers
from draftlab.data.layers import num_target_layers, resolve_layers


@pytest.mark.parametrize("num_layers, expected", [(30, [1, 14, 26]), (32, [1, 15, 28]), (36, [1, 17, 32]),
                                                  (8, [1, 3, 4])])
def test_auto_is_sglang_default(num_layers, expected):
    # SGLang llama.py captures layers [2, L//2, L-3] as inputs = outputs of [1, L//2-1, L-4].
    assert resolve_layers("auto", num_layers) == expected
    assert [k + 1 for k in expected] == [2, num_layers // 2, num_layers - 3]


def test_last_is_the_flagged_ablation(caplog):
    with caplog.at_level(logging.WARNING, logger="draftlab.layers"):
        assert resolve_layers("last", 30) == [29]
    assert "cannot be served by SGLang" in caplog.text
    assert not layers.sglang_servable("last") and layers.sglang_servable("auto")
    assert layers.spec_name([1, 2]) == "explicit"


def test_explicit_list_kept():
    assert resolve_layers([0, 5, 28], 30) == [0, 5, 28]


@pytest.mark.parametrize("spec, fragment", [
    ([1, 14, 29], "last layer's output"),  # SGLang never visits layer L: only 2 tensors would be captured
    ([29], "extract.layers=last"),
    ([1, 30], "outside"),
    ([14, 1], "ascending"),
    ([1, 1], "unique"),
    ([-1], ">= 0"),
    ("first", "not one of"),
    ([], "expected auto"),
])
def test_refusals_name_the_key(spec, fragment):
    with pytest.raises(ConfigError, match=r"^extract\.layers: ") as err:
        resolve_layers(spec, 30)
    assert fragment in str(err.value)


def test_auto_needs_enough_layers():
    with pytest.raises(ConfigError, match="extract.layers"):
        resolve_layers("auto", 6)


def test_num_layers_tiny_from_config():
    cfg = default_config({"target": {"name": "tiny", "tiny": {"num_hidden_layers": 12}}})
    assert num_target_layers(cfg.target) == 12


def test_num_layers_hf_reads_config_json_only(tmp_path):
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 22}
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = default_config({"target": {"name": "hf", "path": str(tmp_path)}})
    assert num_target_layers(cfg.target) == 22


def test_num_layers_smollm2_without_loading_it():
    cfg = default_config()
    assert num_target_layers(cfg.target) == 30
    assert resolve_layers("auto", 30) == [1, 14, 26]

"""SGLang's capture contract: read from SGLang's own model files, and every refusal it implies."""

import json
import textwrap

import pytest

from draftlab.config import ConfigError
from draftlab.sglang.capture import ALLOW_KEY, CaptureError, contract, for_target
from draftlab.sglang.capture_reader import read_contract
from draftlab.sglang.contract import sglang_python

# Model files in SGLang's shapes: a Llama-like class, a wrapper that passes the capture on, one that does not,
# a wrapper around a text model that cannot capture, and a class with no capture at all.
MODELS = {
    "llama.py": """
        class LlamaModel:
            def __init__(self, config):
                self.layers_to_capture = []
            def forward(self, x):
                for i in range(self.start_layer, self.end_layer):
                    keep = i in self.layers_to_capture
        class LlamaForCausalLM:
            def __init__(self, config):
                self.model = self._init_model(config)
            def _init_model(self, config):
                return LlamaModel(config)
            def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):
                if not self.pp_group.is_last_rank:
                    return
                if layer_ids is None:
                    self.model.layers_to_capture = [2, self.config.num_hidden_layers // 2, self.config.num_hidden_layers - 3]
                else:
                    self.model.layers_to_capture = [val + 1 for val in layer_ids]
        class PlainForCausalLM:
            def __init__(self, config):
                self.model = LlamaModel(config)
        EntryClass = [LlamaForCausalLM, PlainForCausalLM]
    """,
    "wrap.py": """
        from sglang.srt.models.llama import LlamaForCausalLM, PlainForCausalLM
        class PassingVL:
            def __init__(self, config):
                self.language_model = LlamaForCausalLM(config.text_config)
            def set_eagle3_layers_to_capture(self, layer_ids=None):
                self.language_model.set_eagle3_layers_to_capture(layer_ids)
        class SilentVL:
            def __init__(self, config):
                self.language_model = LlamaForCausalLM(config.text_config)
        class OverPlainVL:
            def __init__(self, config):
                self.language_model = PlainForCausalLM(config.text_config)
            def set_eagle3_layers_to_capture(self, layer_ids=None):
                self.language_model.set_eagle3_layers_to_capture(layer_ids)
        EntryClass = [PassingVL, SilentVL, OverPlainVL]
    """,
}


@pytest.fixture
def fake_contract(tmp_path):
    for name, source in MODELS.items():
        (tmp_path / name).write_text(textwrap.dedent(source))
    return read_contract(tmp_path, "9.9.9")


def test_reader_runs_the_model_files_own_methods(fake_contract):
    archs = fake_contract["architectures"]
    assert archs["LlamaForCausalLM"] | {} == {**archs["LlamaForCausalLM"], "captures": True, "ids": "plus1",
                                              "default": ["2", "L//2", "L-3"], "last_layer": False}
    assert archs["PassingVL"]["captures"] is True and archs["PassingVL"]["wraps"] == "LlamaForCausalLM"
    assert archs["SilentVL"]["captures"] is False and "define no" in archs["SilentVL"]["why"]
    assert archs["OverPlainVL"]["captures"] is None and "language_model" in archs["OverPlainVL"]["why"]


@pytest.mark.parametrize("arch, fragment", [
    ("PlainForCausalLM", "define no set_eagle3_layers_to_capture"),
    ("SilentVL", "define no set_eagle3_layers_to_capture"),  # a wrapper that does not pass the capture on
    ("OverPlainVL", "passes the capture to a language_model that does not capture"),
])
def test_targets_that_cannot_feed_a_draft_are_refused(fake_contract, arch, fragment):
    config = {"architectures": [arch], "text_config": {"hidden_size": 7168}}
    with pytest.raises(CaptureError) as err:
        for_target(config, data=fake_contract)
    message = str(err.value)
    assert arch in message and "SGLang 9.9.9" in message and fragment in message
    assert "one layer, width 7168" in message and "3 x 7168 = 21504" in message
    assert isinstance(err.value, ConfigError)


def test_an_unlisted_architecture_names_the_override(fake_contract):
    with pytest.raises(CaptureError, match=ALLOW_KEY.replace(".", r"\.")):
        for_target({"architectures": ["NewForCausalLM"]}, data=fake_contract)
    assert not for_target({"architectures": ["NewForCausalLM"]}, allow_unlisted=True, data=fake_contract).listed


def test_the_checked_in_contract_covers_the_families():
    archs = contract()["architectures"]
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                 "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GptOssForCausalLM",
                 "Glm4MoeForCausalLM", "KimiK25ForConditionalGeneration"):
        assert archs[arch]["captures"] is True, arch
    assert archs["DeepseekV3ForCausalLM"]["ids"] == "plus1_if_first_is_1"
    assert archs["KimiK25ForConditionalGeneration"]["wraps"] == "DeepseekV3ForCausalLM"


def test_preflight_refuses_a_class_that_does_not_capture(tiny_cfg, tmp_path):
    from draftlab.config import validate
    from draftlab.preflight import check_target_shape

    folder = tmp_path / "llama4"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Llama4ForCausalLM"], "model_type": "llama4",
                                                    "num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 320}))
    with pytest.raises(ConfigError, match=r"Llama4ForCausalLM .*SGLang .*one layer, width 64.*3 x 64"):
        check_target_shape(validate(tiny_cfg("target=hf", f"target.path={folder}")))
    config = json.loads((folder / "config.json").read_text()) | {"architectures": ["BrandNewForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=ALLOW_KEY.replace(".", r"\.")):
        check_target_shape(validate(tiny_cfg("target=hf", f"target.path={folder}")))
    check_target_shape(validate(tiny_cfg("target=hf", f"target.path={folder}", f"{ALLOW_KEY}=true")))


@pytest.mark.sglang
@pytest.mark.skipif(sglang_python() is None, reason="no sglang venv: run scripts/setup-sglang.sh")
def test_contract_regenerates_from_the_installed_sglang():
    from draftlab.sglang.capture_reader import main

    assert main([]) == 0  # compares the checked-in file with one read from the installed package's model files

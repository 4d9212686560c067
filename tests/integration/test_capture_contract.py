"""SGLang's capture contract: read from SGLang's own model files, and every refusal it implies."""

import json
import textwrap

import pytest

from draftlab.config.config import ConfigError
from draftlab.sglang import capture
from draftlab.sglang.capture import ALLOW_KEY, CaptureError, contract, for_target, resolve_version, shipped_versions
from draftlab.sglang.capture_reader import read_contract
from draftlab.sglang.contract import sglang_python, sglang_sources

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
    assert arch in message and "SGLang 9.9.9" in message and fragment in message and "\n" not in message
    assert "one layer" not in message and "3 x 7168 = 21504" in message
    assert isinstance(err.value, ConfigError)


def test_an_unlisted_architecture_names_the_override(fake_contract):
    with pytest.raises(CaptureError, match=ALLOW_KEY.replace(".", r"\.")):
        for_target({"architectures": ["NewForCausalLM"]}, data=fake_contract)
    assert not for_target({"architectures": ["NewForCausalLM"]}, allow_unlisted=True, data=fake_contract).listed


def test_every_shipped_contract_covers_the_families():
    assert shipped_versions() == ["0.5.17", "0.5.23"]
    for version in shipped_versions():
        data = contract(version)
        archs = data["architectures"]
        assert data["sglang_version"] == version
        for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                     "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GptOssForCausalLM",
                     "Glm4MoeForCausalLM", "KimiK25ForConditionalGeneration", "Qwen3VLForConditionalGeneration",
                     "MiniMaxM2ForCausalLM", "ExaoneMoEForCausalLM", "Llama4ForCausalLM",
                     "Llama4ForConditionalGeneration", "Gemma4ForConditionalGeneration", "TeleFLMForCausalLM"):
            assert archs[arch]["captures"] is True, (version, arch)
        assert archs["DeepseekV3ForCausalLM"]["ids"] == "plus1_if_first_is_1"
        assert archs["KimiK25ForConditionalGeneration"]["wraps"] == "DeepseekV3ForCausalLM"
        for arch in ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"):  # captured before the residual add
            assert archs[arch]["captures"] is False and "before the residual add" in archs[arch]["why"]


def test_the_classes_a_plain_reading_missed_capture_in_0_5_23():
    archs = contract("0.5.23")["architectures"]
    for arch in ("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
                 "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForCausalLM",
                 "Qwen3_5MoeForCausalLM", "MiniMaxM2ForCausalLM", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM",
                 "Llama4ForCausalLM", "Llama4ForConditionalGeneration", "Gemma4ForConditionalGeneration",
                 "TeleFLMForCausalLM"):
        assert {k: archs[arch].get(k) for k in ("captures", "ids")} == {"captures": True, "ids": "plus1"}, arch
    # 0.5.17's Qwen3.5 has no EAGLE-3 setter: Qwen3-VL's stores the list, and its forward reads layer marks only
    old = contract("0.5.17")["architectures"]["Qwen3_5ForConditionalGeneration"]
    assert old["captures"] is False and "_is_layer_to_capture" in old["why"]


@pytest.mark.parametrize("version, says", [
    ("0.5.23", "SGLang 0.5.23's server refuses to start with it (ValueError in srt/model_executor/"
               "model_runner_components/attention_backend_setup.py:configure_aux_hidden_state_capture)"),
    ("0.5.17", "SGLang 0.5.17's server fails at start-up with it (AttributeError in srt/model_executor/"),
])
def test_a_class_without_the_method_names_what_that_sglang_does(version, says):
    with pytest.raises(CaptureError) as err:
        for_target({"architectures": ["BaichuanForCausalLM"], "hidden_size": 64}, version=version)
    assert says in str(err.value) and "BaichuanForCausalLM" in str(err.value)


def test_the_version_is_asked_for_else_installed_else_the_newest(monkeypatch):
    monkeypatch.setattr(capture, "installed_version", lambda: None)
    assert resolve_version() == "0.5.23" and resolve_version("0.5.17") == "0.5.17"
    assert for_target({"architectures": ["LlamaForCausalLM"]}, version="0.5.17").version == "0.5.17"
    with pytest.raises(CaptureError) as err:
        resolve_version("0.5.20")
    assert str(err.value) == ("serve.sglang_version: no capture contract for serve.sglang_version=0.5.20; "
                              "shipped: 0.5.17, 0.5.23")
    monkeypatch.setattr(capture, "installed_version", lambda: "0.5.17")
    assert resolve_version() == "0.5.17" and resolve_version("0.5.23") == "0.5.23"
    monkeypatch.setattr(capture, "installed_version", lambda: "0.5.21")
    with pytest.raises(CaptureError, match=r"the installed sglang 0\.5\.21; shipped: 0\.5\.17, 0\.5\.23$"):
        resolve_version()


def test_check_draft_and_preflight_refuse_an_unshipped_version(tiny_cfg, tmp_path, capsys):
    from draftlab.config.config import validate
    from draftlab.checks.preflight import preflight
    from draftlab.sglang.check import check_draft_main

    assert check_draft_main([str(tmp_path), "--sglang-version", "0.4.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("check-draft: serve.sglang_version: no capture contract for serve.sglang_version=0.4.0; "
                   "shipped: 0.5.17, 0.5.23")
    with pytest.raises(ConfigError, match=r"serve\.sglang_version=0\.4\.0; shipped: 0\.5\.17, 0\.5\.23"):
        preflight(validate(tiny_cfg("serve.sglang_version=0.4.0")))


def test_preflight_refuses_a_class_that_does_not_capture(tiny_cfg, tmp_path):
    from draftlab.config.config import validate
    from draftlab.checks.preflight import check_target_shape

    folder = tmp_path / "llama4"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["BaichuanForCausalLM"], "model_type": "baichuan",
                                                    "num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 320}))
    with pytest.raises(ConfigError, match=r"BaichuanForCausalLM .*SGLang 0\.5\.17's server fails at start-up"):
        check_target_shape(validate(tiny_cfg("target=hf", f"target.path={folder}", "serve.sglang_version=0.5.17")))
    config = json.loads((folder / "config.json").read_text()) | {"architectures": ["BrandNewForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=ALLOW_KEY.replace(".", r"\.")):
        check_target_shape(validate(tiny_cfg("target=hf", f"target.path={folder}")))
    check_target_shape(validate(tiny_cfg("target=hf", f"target.path={folder}", f"{ALLOW_KEY}=true")))


@pytest.mark.sglang
@pytest.mark.skipif(sglang_python() is None, reason="no sglang venv: run scripts/setup-sglang.sh")
def test_every_shipped_contract_regenerates_from_its_own_sglang():
    from draftlab.sglang.capture_reader import main

    # each version's source: the venv's sglang, and the older ones scripts/sglang-source.sh unpacked beside it
    assert set(shipped_versions()) <= set(sglang_sources()), "run scripts/setup-sglang.sh for every version's source"
    assert main([]) == 0  # compares every shipped capture_<version>.json with one read from that version's files

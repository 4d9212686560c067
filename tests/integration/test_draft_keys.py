"""check-draft reads what SGLang reads: every draft config key SGLang's EAGLE-3 draft class and worker read is
judged, a foreign draft with a bad value of one is refused, and stray weight files are named."""

import json
import shutil
import textwrap

import pytest
from safetensors.torch import save_file

from draftlab.sglang import draft_keys
from draftlab.sglang.check import check_draft, check_draft_main
from draftlab.sglang.contract import sglang_python
from draftlab.sglang.draft_keys_reader import read_draft_contract
from sglang_fixtures import draft_tensors, write_draft, write_target

# One bad value per key SGLang reads (a foreign draft's config, checked with --target only). A key SGLang starts
# reading needs a row here and a check in draft_keys.CHECKED.
BAD = {
    "attention_bias": {"attention_bias": True},
    "bias": {"bias": True},
    "draft_vocab_size": {"draft_vocab_size": 31},
    "eagle_aux_hidden_state_layer_ids": {"eagle_config": {}, "eagle_aux_hidden_state_layer_ids": [1, 3, 4]},
    "eagle_config": {"eagle_config": [1, 3, 4]},
    "eagle_config.eagle_aux_hidden_state_layer_ids": {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3]}},
    "eagle_config.norm_before_fc": {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4],
                                                     "norm_before_fc": True}},
    "eagle_config.use_aux_hidden_state": {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4],
                                                           "use_aux_hidden_state": False}},
    "fc_norm": {"fc_norm": True},
    "head_dim": {"head_dim": 4},
    "hidden_act": {"hidden_act": "gelu"},
    "hidden_size": {"hidden_size": 32},
    "intermediate_size": {"intermediate_size": 64},
    "intermediate_size_mlp": {"model_type": "llama4_text", "intermediate_size_mlp": 64},
    "max_position_embeddings": {"max_position_embeddings": 1024},
    "model_type": {"model_type": "llama4_text"},
    "norm_before_fc": {"norm_before_fc": True},
    "norm_output": {"norm_output": True},
    "num_attention_heads": {"num_attention_heads": 4},
    "num_aux_hidden_states": {"num_aux_hidden_states": 2},
    "num_hidden_layers": {"num_hidden_layers": 2},
    "num_key_value_heads": {"num_key_value_heads": 2},
    "original_max_position_embeddings": {"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                                         "original_max_position_embeddings": -1},
    "partial_rotary_factor": {"partial_rotary_factor": 0.5},
    "rms_norm_eps": {"rms_norm_eps": 0},
    "rope_is_neox_style": {"rope_is_neox_style": False},
    "rope_parameters": {"rope_parameters": "default"},
    "rope_parameters.mrope_section": {"rope_parameters": {"rope_theta": 10000, "mrope_section": [2, 2]}},
    "rope_parameters.rope_theta": {"rope_parameters": {"rope_theta": 500000}},
    "rope_scaling": {"rope_scaling": [2.0]},
    "rope_scaling.mrope_section": {"rope_scaling": {"mrope_section": [2, 2]}},
    "rope_theta": {"rope_theta": 500000},
    "target_hidden_size": {"target_hidden_size": None},
    "tie_word_embeddings": {"tie_word_embeddings": True},
    "use_aux_norm": {"use_aux_norm": True},
    "vocab_size": {"vocab_size": 65},
}


@pytest.fixture
def target(tmp_path):
    return write_target(tmp_path / "target")


def test_every_key_sglang_reads_is_checked():
    assert draft_keys.unchecked() == [], "judge these keys in check-draft (draft_keys.CHECKED) and add a BAD row"
    assert sorted(set(draft_keys.contract()["keys"]) - set(BAD)) == []


def test_the_contract_holds_the_keys_that_change_what_sglang_feeds_the_draft():
    keys = draft_keys.contract()["keys"]
    assert "eagle_config.use_aux_hidden_state" in keys and "eagle_config.eagle_aux_hidden_state_layer_ids" in keys
    assert draft_keys.contract()["weight_files"] == {"patterns": ["*.safetensors", "*.bin"], "first_match_wins": True,
                                                     "index": "model.safetensors.index.json"}


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_foreign_draft_with_a_bad_value_is_not_passed(tmp_path, target, key):
    folder = write_draft(tmp_path / "d", config_patch=BAD[key])
    report = check_draft(folder, target=target, scan_weights=False)
    named = [f for f in report.findings if key in f.where or f.where.endswith(key.split(".")[-1])]
    assert not report.ok or named, f"{key}={BAD[key]} passes check-draft silently:\n{report.summary()}"
    assert write_draft(tmp_path / "good", config_patch={}) and check_draft(tmp_path / "good", target=target,
                                                                            scan_weights=False).ok


@pytest.mark.parametrize("key", sorted(k for k in BAD if k.startswith("eagle_config")))
def test_a_specforge_style_draft_is_refused_for_every_eagle_config_defect(tmp_path, target, key):
    """Another trainer's names (SpecForge's `midlayer.*`), no draftlab record, checked with --target alone."""
    def specforge(name):
        return name.replace("layers.0.", "midlayer.")

    good = write_draft(tmp_path / "good", rename=specforge)
    assert check_draft(good, target=target).ok
    report = check_draft(write_draft(tmp_path / "d", config_patch=BAD[key], rename=specforge), target=target)
    assert not report.ok, report.summary()


def test_use_aux_hidden_state_false_is_refused_naming_it(tmp_path, target, capsys):
    folder = write_draft(tmp_path / "d", config_patch=BAD["eagle_config.use_aux_hidden_state"])
    assert check_draft_main([str(folder), "--target", str(target), "--no-weight-scan"]) == 1
    assert "ERROR eagle_config.use_aux_hidden_state: False" in capsys.readouterr().err


def test_a_second_weight_file_without_an_index_is_an_error_naming_both(tmp_path, target):
    folder = write_draft(tmp_path / "d")
    stale = draft_tensors(json.loads((folder / "config.json").read_text()), seed=1)
    save_file({k: v.contiguous() for k, v in stale.items()}, str(folder / "model-old.safetensors"))
    report = check_draft(folder, target=target)
    message = " ".join(str(f) for f in report.errors)
    assert not report.ok and "model-old.safetensors" in message and "model.safetensors'" in message
    index = {"weight_map": {k: "model.safetensors" for k in stale}}  # an index says which file SGLang reads
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert check_draft(folder, target=target).ok


def test_bin_weights_are_named_not_merged(tmp_path, target):
    folder = write_draft(tmp_path / "d")
    shutil.move(folder / "model.safetensors", folder / "pytorch_model.bin")
    report = check_draft(folder, target=target, scan_weights=False)
    assert not report.ok and "pytorch_model.bin" in " ".join(str(f) for f in report.errors)


SOURCES = {
    "models/llama.py": """
        class LlamaDecoderLayer:
            def __init__(self, config):
                theta = getattr(config, "rope_theta", 10000)
        class LlamaForCausalLM:
            def set_embed(self, embed):
                if hasattr(self.config, "target_hidden_size"):
                    return
    """,
    "models/llama_eagle3.py": """
        from sglang.srt.models.llama import LlamaDecoderLayer, LlamaForCausalLM
        class LlamaDecoderLayer(LlamaDecoderLayer):
            def __init__(self, config):
                super().__init__(config)
                self.eps = config.rms_norm_eps
        class LlamaModel:
            def __init__(self, config):
                self.layers = [LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers)]
                eagle_config = getattr(config, "eagle_config", None) or {}
                self.flag = eagle_config.get("norm_before_fc", False)
        class LlamaForCausalLMEagle3(LlamaForCausalLM):
            def __init__(self, config):
                self.model = LlamaModel(config)
        EntryClass = [LlamaForCausalLMEagle3]
    """,
    "speculative/eagle_utils.py": """
        def get_draft_input_from_target_hidden_dim(model_runner):
            hf_config = model_runner.model_config.hf_config
            eagle_config = getattr(hf_config, "eagle_config", None) or {}
            get_eagle_config = eagle_config.get if isinstance(eagle_config, dict) else None
            use_aux = get_eagle_config("use_aux_hidden_state", True)
    """,
    "model_executor/model_runner_components/spec_aux_hidden_state.py": """
        def _resolve_eagle_aux_hidden_state(config, draft_model_config):
            eagle_config = getattr(draft_model_config.hf_config, "eagle_config", None)
            config.ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
            config.unrelated = config.draft_kv_num_layers
    """,
    "model_loader/loader.py": """
        from transformers.utils import SAFE_WEIGHTS_INDEX_NAME
        class DefaultModelLoader:
            def _prepare_weights(self, load_format):
                index_file = SAFE_WEIGHTS_INDEX_NAME
                if load_format == LoadFormat.AUTO:
                    allow_patterns = ["*.safetensors", "*.bin"]
                else:
                    allow_patterns = ["*.pt"]
    """,
}


def test_the_reader_follows_the_draft_class_its_bases_and_the_worker(tmp_path):
    srt = tmp_path / "sglang" / "srt"
    for name, source in SOURCES.items():
        (srt / name).parent.mkdir(parents=True, exist_ok=True)
        (srt / name).write_text(textwrap.dedent(source))
    (tmp_path / "transformers" / "utils").mkdir(parents=True)
    (tmp_path / "transformers" / "utils" / "__init__.py").write_text('SAFE_WEIGHTS_INDEX_NAME = "m.index.json"\n')
    found = read_draft_contract(srt, "9.9.9")
    assert sorted(found["keys"]) == ["eagle_config", "eagle_config.eagle_aux_hidden_state_layer_ids",
                                     "eagle_config.norm_before_fc", "eagle_config.use_aux_hidden_state",
                                     "num_hidden_layers", "rms_norm_eps", "rope_theta", "target_hidden_size"]
    assert found["keys"]["rope_theta"] == ["llama.py:LlamaDecoderLayer.__init__"]  # reached through super()
    assert found["weight_files"] == {"patterns": ["*.safetensors", "*.bin"], "first_match_wins": True,
                                     "index": "m.index.json"}


@pytest.mark.sglang
@pytest.mark.skipif(sglang_python() is None, reason="no sglang venv: run scripts/setup-sglang.sh")
def test_draft_contract_regenerates_from_the_installed_sglang():
    from draftlab.sglang.draft_keys_reader import main

    assert main([]) == 0  # compares the checked-in file with one read from the installed package's source

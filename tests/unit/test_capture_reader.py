"""The capture reader on model files in SGLang's shapes: one case per way a class hides its capture from a plain
reading (each of them cost real SGLang classes their place in the contract), and the capture it must refuse."""

import textwrap

import pytest

from draftlab.sglang.capture import for_target
from draftlab.sglang.capture_reader import read_contract

LLAMA = """
    class LlamaModel:
        def __init__(self, config):
            self.layers_to_capture = []
        def forward(self, x):
            for i in range(len(self.layers)):
                keep = i in self.layers_to_capture
    class LlamaForCausalLM:
        def __init__(self, config, quant_config=None, prefix=""):
            self.model = self._init_model(config)
        def _init_model(self, config):
            return LlamaModel(config)
        def set_eagle3_layers_to_capture(self, layer_ids=None):
            if not self.pp_group.is_last_rank:
                return
            if layer_ids is None:
                n = self.config.num_hidden_layers
                self.model.layers_to_capture = [2, n // 2, n - 3]
            else:
                self.model.layers_to_capture = [val + 1 for val in layer_ids]
    EntryClass = [LlamaForCausalLM]
"""
# The model runner's call of the capture method, with SGLang 0.5.23's check in front of it
RUNNER = """
    def configure_aux_hidden_state_capture(*, model, eagle_aux_hidden_state_layer_ids):
        if not hasattr(model, "set_eagle3_layers_to_capture"):
            raise ValueError("Model does not implement set_eagle3_layers_to_capture")
        model.set_eagle3_layers_to_capture(eagle_aux_hidden_state_layer_ids)
"""
PLUS1 = {"captures": True, "ids": "plus1", "default": ["2", "L//2", "L-3"]}


def read(tmp_path, runner: str = RUNNER, **files) -> dict:
    models = tmp_path / "srt" / "models"
    models.mkdir(parents=True)
    for name, source in {"llama": LLAMA, **files}.items():
        (models / f"{name}.py").write_text(textwrap.dedent(source))
    (tmp_path / "srt" / "model_executor").mkdir()
    (tmp_path / "srt" / "model_executor" / "setup.py").write_text(textwrap.dedent(runner))
    return read_contract(models, "9.9.9")


def assert_plus1(entry: dict) -> None:
    assert {k: entry.get(k) for k in PLUS1} == PLUS1, entry


def test_a_parallel_state_guard_is_passed(tmp_path):
    """MiniMax-M2, Exaone-MoE: the guard asks a module-level function, not `self`, for the pipeline rank."""
    archs = read(tmp_path, guard="""
        from sglang.srt.models.llama import LlamaModel
        from sglang.srt.runtime_context import get_parallel
        class GuardedForCausalLM:
            def __init__(self, config):
                self.model = LlamaModel(config)
            def set_eagle3_layers_to_capture(self, layer_ids=None):
                if not get_parallel().pp_group.is_last_rank:
                    return
                self.capture_aux_hidden_states = True
                if layer_ids is None:
                    n = self.config.num_hidden_layers
                    self.model.layers_to_capture = [2, n // 2, n - 3]
                else:
                    self.model.layers_to_capture = [val + 1 for val in layer_ids]
        EntryClass = GuardedForCausalLM
    """)["architectures"]
    assert_plus1(archs["GuardedForCausalLM"])


def test_an_inner_class_held_in_a_variable(tmp_path):
    """Qwen3-VL builds `self.model = language_model_cls(...)`, a parameter whose default a subclass (Qwen3.5)
    replaces through super().__init__, and asks `hasattr(self.model, ...)` to choose how to store the ids; the
    Qwen3.5 text classes build `self.model = self.body_cls(...)` from a class attribute naming another module's
    class."""
    archs = read(tmp_path, vl="""
        from sglang.srt.models.llama import LlamaModel
        class TextModel(LlamaModel):
            pass
        class CapturingText(LlamaModel):
            def set_eagle3_layers_to_capture(self, layers_to_capture):
                self.layers_to_capture = layers_to_capture
        class VLForConditionalGeneration:
            def __init__(self, config, quant_config=None, prefix="", language_model_cls=TextModel):
                self.model = language_model_cls(config=config)
            def set_eagle3_layers_to_capture(self, layer_ids=None):
                if layer_ids is None:
                    n = self.config.num_hidden_layers
                    layers_to_capture = [2, n // 2, n - 3]
                else:
                    layers_to_capture = [val + 1 for val in layer_ids]
                if hasattr(self.model, "set_eagle3_layers_to_capture"):
                    self.model.set_eagle3_layers_to_capture(layers_to_capture)
                else:
                    self.model.layers_to_capture = layers_to_capture
        class NextVLForConditionalGeneration(VLForConditionalGeneration):
            def __init__(self, config, quant_config=None, prefix="", language_model_cls=CapturingText):
                super().__init__(config, quant_config, prefix, language_model_cls)
        EntryClass = [VLForConditionalGeneration, NextVLForConditionalGeneration]
    """, text="""
        from sglang.srt.models import vl
        class TextForCausalLM:
            body_cls = vl.CapturingText
            def __init__(self, config):
                self.model = self.body_cls(config=config)
            def set_eagle3_layers_to_capture(self, layer_ids=None):
                if layer_ids is None:
                    n = len(self.model.layers)
                    layers_to_capture = [2, n // 2, n - 3]
                else:
                    layers_to_capture = [val + 1 for val in layer_ids]
                self.model.set_eagle3_layers_to_capture(layers_to_capture)
        EntryClass = [TextForCausalLM]
    """)["architectures"]
    for name in ("VLForConditionalGeneration", "NextVLForConditionalGeneration", "TextForCausalLM"):
        assert_plus1(archs[name])


def test_a_wrapped_class_imported_inside_init(tmp_path):
    """Llama-4's vision class imports its text class inside `__init__`."""
    archs = read(tmp_path, mm="""
        class LateVL:
            def __init__(self, config):
                from sglang.srt.models.llama import LlamaForCausalLM
                self.language_model = LlamaForCausalLM(config.text_config)
            def set_eagle3_layers_to_capture(self, layer_ids=None):
                self.language_model.set_eagle3_layers_to_capture(layer_ids)
        EntryClass = LateVL
    """)["architectures"]
    assert_plus1(archs["LateVL"])
    assert archs["LateVL"]["wraps"] == "LlamaForCausalLM"


def test_ids_stored_into_the_language_models_capture_list(tmp_path):
    """Gemma-4's multimodal class writes `self.language_model.layers_to_capture` itself."""
    archs = read(tmp_path, direct="""
        from sglang.srt.models.llama import LlamaModel
        class DirectVL:
            def __init__(self, config):
                self.language_model = LlamaModel(config.text_config)
            def set_eagle3_layers_to_capture(self, layer_ids=None):
                if layer_ids is None:
                    n = self.config.text_config.num_hidden_layers
                    self.language_model.layers_to_capture = [2, n // 2, n - 3]
                else:
                    self.language_model.layers_to_capture = [val + 1 for val in layer_ids]
        EntryClass = DirectVL
    """)["architectures"]
    assert_plus1(archs["DirectVL"])
    assert archs["DirectVL"]["wraps"] == "LlamaModel"


def test_a_model_built_by_the_bases_init_through_an_overridden_helper(tmp_path):
    """Llama-4 and TeleFLM inherit Llama's `__init__` and override only `_init_model`."""
    archs = read(tmp_path, sub="""
        from sglang.srt.models.llama import LlamaForCausalLM, LlamaModel
        class OwnModel(LlamaModel):
            pass
        class SubForCausalLM(LlamaForCausalLM):
            def __init__(self, config, quant_config=None, prefix=""):
                super().__init__(config, quant_config, prefix)
            def _init_model(self, config):
                return OwnModel(config)
        EntryClass = [SubForCausalLM]
    """)["architectures"]
    assert_plus1(archs["SubForCausalLM"])


PRE_ADD = """
    class {name}Model:
        def __init__(self, config):
            self.layers_to_capture = []
        def forward(self, hidden_states):
            aux_hidden_states, residual = [], None
            for i, layer in enumerate(self.layers):
                if i in self.layers_to_capture:
                    aux_hidden_states.append({captured})
                hidden_states, residual = layer(hidden_states, residual)
    class {name}ForCausalLM:
        def __init__(self, config):
            self.model = {name}Model(config)
        def set_eagle3_layers_to_capture(self, layer_ids=None):
            if layer_ids is None:
                n = self.config.num_hidden_layers
                self.model.layers_to_capture = [2, n // 2, n - 3]
            else:
                self.model.layers_to_capture = [val + 1 for val in layer_ids]
    EntryClass = [{name}ForCausalLM]
"""


def test_a_capture_before_the_residual_add_is_refused(tmp_path):
    """Gemma-3's layers return their MLP branch and the residual apart; it captures the branch alone."""
    archs = read(tmp_path, gemma=PRE_ADD.format(name="PreAdd", captured="hidden_states"),
                 summed=PRE_ADD.format(name="Summed", captured="hidden_states + residual"))["architectures"]
    assert archs["PreAddForCausalLM"]["captures"] is False
    assert "before the residual add" in archs["PreAddForCausalLM"]["why"]
    assert_plus1(archs["SummedForCausalLM"])  # the residual stream, summed where it is captured
    with pytest.raises(Exception, match=r"PreAddForCausalLM .*captures `hidden_states`.*before the residual add"):
        for_target({"architectures": ["PreAddForCausalLM"]}, data=read(tmp_path / "again",
                   gemma=PRE_ADD.format(name="PreAdd", captured="hidden_states")))


@pytest.mark.parametrize("runner, says", [
    (RUNNER, "server refuses to start with it (ValueError in srt/model_executor/setup.py:"
             "configure_aux_hidden_state_capture)"),
    (RUNNER.replace('if not hasattr(model, "set_eagle3_layers_to_capture"):', "if False:"),
     "server fails at start-up with it (AttributeError in srt/model_executor/setup.py:"),
])
def test_a_class_without_the_method_is_refused_with_what_the_server_does(tmp_path, runner, says):
    data = read(tmp_path, runner, plain="""
        from sglang.srt.models.llama import LlamaModel
        class PlainForCausalLM:
            def __init__(self, config):
                self.model = LlamaModel(config)
        EntryClass = PlainForCausalLM
    """)
    with pytest.raises(Exception) as err:
        for_target({"architectures": ["PlainForCausalLM"], "hidden_size": 64}, data=data)
    message = str(err.value)
    assert "PlainForCausalLM" in message and "SGLang 9.9.9" in message and says in message
    assert "one layer" not in message and "\n" not in message


MARKED = """
    class MarkedModel:
        def __init__(self, config):
            self.layers_to_capture = []
        def forward(self, x):
            for layer in self.layers:
                x = layer(x, captured=aux if getattr(layer, "_is_layer_to_capture", False) else None)
        {setter}
    class MarkedForCausalLM:
        def __init__(self, config):
            self.model = MarkedModel(config)
        def set_eagle3_layers_to_capture(self, layer_ids=None):
            n = self.config.num_hidden_layers
            layers_to_capture = [2, n // 2, n - 3] if layer_ids is None else [val + 1 for val in layer_ids]
            if hasattr(self.model, "set_eagle3_layers_to_capture"):
                self.model.set_eagle3_layers_to_capture(layers_to_capture)
            else:
                self.model.layers_to_capture = layers_to_capture
    EntryClass = MarkedForCausalLM
"""
SETTER = """def set_eagle3_layers_to_capture(self, layers_to_capture):
            self.layers_to_capture = layers_to_capture
            for layer_id in self.layers_to_capture:
                setattr(self.layers[layer_id], "_is_layer_to_capture", True)"""


def test_a_forward_that_reads_layer_marks_captures_only_where_they_are_set(tmp_path):
    """Qwen3.5 reads marks on its layers, not the list: SGLang 0.5.17's has no setter that marks them, so Qwen3-VL's
    method stores the bare list and nothing is captured; 0.5.23's marks them."""
    assert_plus1(read(tmp_path / "a", marked=MARKED.format(setter=SETTER))["architectures"]["MarkedForCausalLM"])
    unmarked = read(tmp_path / "b", marked=MARKED.format(setter="pass"))["architectures"]["MarkedForCausalLM"]
    assert unmarked["captures"] is False and "never sets" in unmarked["why"]

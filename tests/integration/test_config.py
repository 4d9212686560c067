"""Config: every option composes and validates; bad input fails before any work, naming the key."""

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import CONF, REPO, compose_config
from draftlab.config.config import ConfigError, validate
from draftlab.task import preflight

GROUP_OPTIONS = [f"{group.name}={option.stem}" for group in sorted(CONF.iterdir()) if group.is_dir()
                 for option in sorted(group.glob("*.yaml")) if group.name not in ("experiment", "benchmark")]


@pytest.mark.parametrize("override", GROUP_OPTIONS)
def test_every_group_option_composes_and_validates(override):
    extra = ["target.path=/some/model"] if override == "target=hf" else []
    cfg = validate(compose_config([override, *extra]))
    assert cfg.data.samples > 0


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_composes_and_validates(experiment):
    validate(compose_config([f"experiment={experiment}", "target=tiny"]))


def test_default_target_is_smollm2_with_sglang_default_layers():
    cfg = validate(compose_config())
    assert cfg.target.name == "smollm2" and cfg.extract.layers == "auto" and cfg.serve.backend == "local"


def test_misspelt_key_is_refused_by_hydra_naming_it():
    with pytest.raises(Exception, match="data.sampels"):
        compose_config(["data.sampels=3"])


@pytest.mark.parametrize("override, key", [
    ("data.samples=0", "data.samples"),
    ("data.samples=-4", "data.samples"),
    ("train.schedule=exponential", "train.schedule"),
    ("extract.dtype=int8", "extract.dtype"),
    ("data.val_fraction=1.5", "data.val_fraction"),
    ("serve.backend=vllm", "serve.backend"),
    ("data.shard_size=20", "data.shard_size"),
    ("train.compile_cpp_wrapper=sometimes", "train.compile_cpp_wrapper"),
    ("train.compile_cuda_graphs=sometimes", "train.compile_cuda_graphs"),
    ("train.freeze_lm_head=sometimes", "train.freeze_lm_head"),
    ("train.graph_count_bucket=0", "train.graph_count_bucket"),
])
def test_impossible_values_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=f"^{key.replace('.', '[.]')}"):
        validate(compose_config([override]))


def test_wrong_type_is_refused_naming_the_key():
    cfg = compose_config()
    cfg.data.samples = "many"
    with pytest.raises(ConfigError, match="^data.samples"):
        validate(cfg)


@pytest.mark.parametrize("layers", ["[5,3]", "[1,1,2]", "[1,2,99]"])
def test_bad_layer_lists_are_refused_before_any_model_loads(layers, monkeypatch):
    import draftlab.target.target as target

    monkeypatch.setattr(target, "load_target", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ConfigError, match="extract.layers"):
        preflight(validate(compose_config([f"extract.layers={layers}"])))


def test_draft_vocabulary_larger_than_the_target_is_refused():
    with pytest.raises(ConfigError, match="draft.vocab_size"):
        preflight(validate(compose_config(["target=tiny", "draft.vocab_size=1000"])))


def test_params_yaml_is_the_composed_default_config():
    """params.yaml is what `dvc exp run` composes from conf/; it must not drift."""
    composed = OmegaConf.to_container(compose_config(), resolve=True)
    assert OmegaConf.to_container(OmegaConf.load(REPO / "params.yaml")) == composed


def _run_cli(*args):
    return subprocess.run([sys.executable, str(REPO / "src" / "run.py"), *args, "tracking.enabled=false",
                           "hydra.run.dir=/tmp/draftlab-test-runs"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_cli_misspelt_key_fails_at_once_naming_it():
    result = _run_cli("data.sampels=3")
    assert result.returncode != 0 and "data.sampels" in result.stderr


def test_cli_zero_samples_fails_naming_the_key():
    result = _run_cli("data.samples=0")
    assert result.returncode != 0 and "data.samples" in (result.stderr + result.stdout)

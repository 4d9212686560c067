"""Defaults live in one place, conf/: the schema holds types and checks, default_config() is
the composed conf/, and the tests' tiny recipe is experiment=smoke."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf, open_dict

from conftest import compose_config, tiny_overrides
from draftlab.config.config import ConfigError, default_config, validate
from draftlab.config.config_schema import Config


def leaves(node, prefix=""):
    for key in node:
        value = node._get_node(key)
        path = f"{prefix}{key}"
        if OmegaConf.is_dict(value):
            yield from leaves(value, path + ".")
        else:
            yield path, value


def test_default_config_equals_the_composed_conf():
    assert OmegaConf.to_container(default_config()) == OmegaConf.to_container(validate(compose_config()))


def test_schema_values_are_missing_or_pinned_to_conf():
    """A value the schema still holds (train.*, until that section's owner moves it) must equal conf/'s."""
    composed = validate(compose_config())
    held = {k: v._value() for k, v in leaves(OmegaConf.structured(Config)) if not OmegaConf.is_missing(
        OmegaConf.structured(Config), k) and not v._is_missing()}
    assert all(k.startswith("train.") for k in held), sorted(held)
    for key, value in held.items():
        assert OmegaConf.select(composed, key) == value, key


def test_a_key_conf_forgets_is_refused_naming_it():
    cfg = compose_config()
    with open_dict(cfg):
        del cfg.data["seed"]
    with pytest.raises(ConfigError, match=r"^data\.seed: no value"):
        validate(cfg)


def test_default_config_overrides_and_misspelt_keys():
    assert default_config({"data": {"samples": 7}}).data.samples == 7
    with pytest.raises(ConfigError, match="data.sampels"):
        default_config({"data": {"sampels": 7}})


def test_tests_use_the_smoke_recipe(tmp_path):
    tests = validate(compose_config(tiny_overrides(tmp_path)))
    smoke = validate(compose_config(["experiment=smoke"]))
    for section in ("target", "data", "extract", "draft", "train", "serve", "bench"):
        assert tests[section] == smoke[section], section
    assert smoke.target.name == "tiny"

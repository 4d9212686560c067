"""conf/serve/sglang.yaml extends local.yaml: one place for the shared serving defaults."""

from omegaconf import OmegaConf

from conftest import CONF, compose_config


def test_sglang_serve_config_is_local_with_the_sglang_backend():
    local = OmegaConf.to_container(compose_config(["serve=local"]).serve)
    sglang = OmegaConf.to_container(compose_config(["serve=sglang"]).serve)
    assert local.pop("backend") == "local" and sglang.pop("backend") == "sglang"
    assert sglang == local
    own = OmegaConf.load(CONF / "serve" / "sglang.yaml")
    assert set(own) == {"defaults", "backend"}  # nothing repeated from local.yaml

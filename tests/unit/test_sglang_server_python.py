"""The SGLang the server process will run is found (or refused) before any stage starts."""

import sys

import pytest

from draftlab.config.config import ConfigError, default_config
from draftlab.checks.preflight import check_sglang_server
from draftlab.sglang.server_python import ServerPythonError, server_sglang


def fake_site(root, version="0.5.17"):
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    info = root / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return root


def test_server_site_is_read_through_serve_env(tmp_path):
    site = fake_site(tmp_path / "site")
    cfg = default_config({"serve": {"backend": "sglang", "python": sys.executable, "env": {"PYTHONPATH": str(site)}}})
    origin, version = server_sglang(cfg.serve)
    assert origin == str(site / "sglang" / "__init__.py") and version == "0.5.17"


def test_an_interpreter_without_sglang_is_refused_before_any_stage(tmp_path):
    cfg = default_config({"serve": {"backend": "both", "python": sys.executable,
                                    "env": {"PYTHONPATH": str(tmp_path)}}})
    with pytest.raises(ConfigError, match=r"serve.python: .* cannot import sglang"):
        check_sglang_server(cfg)
    with pytest.raises(ServerPythonError, match="cannot be run"):
        server_sglang(default_config({"serve": {"python": str(tmp_path / "no-python")}}).serve)


def test_the_local_engine_asks_nothing(tmp_path):
    cfg = default_config({"serve": {"backend": "local", "python": str(tmp_path / "no-python")}})
    check_sglang_server(cfg)  # no SGLang will be launched: nothing to find


def test_the_server_must_run_the_release_whose_contract_reads_the_layers(tmp_path, monkeypatch):
    from draftlab.sglang import capture

    monkeypatch.setattr(capture, "installed_version", lambda: None)  # null: the newest contract, 0.5.23
    site = fake_site(tmp_path / "site", "0.5.17")
    serve = {"backend": "sglang", "python": sys.executable, "env": {"PYTHONPATH": str(site)}}
    with pytest.raises(ConfigError, match=r"^serve\.sglang_version: the server will run sglang 0\.5\.17 .*SGLang "
                       r"0\.5\.23's capture contract; set serve\.sglang_version=0\.5\.17$"):
        check_sglang_server(default_config({"serve": serve}))
    check_sglang_server(default_config({"serve": {**serve, "sglang_version": "0.5.17"}}))
    other = fake_site(tmp_path / "other", "0.5.20")
    with pytest.raises(ConfigError, match=r"no capture contract ships for 0\.5\.20 \(shipped: 0\.5\.17, 0\.5\.23\)"):
        check_sglang_server(default_config({"serve": {**serve, "env": {"PYTHONPATH": str(other)}}}))

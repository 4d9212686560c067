"""data.engine=server: generation through a stand-in SGLang/vLLM server wrapping the tiny target equals local
generation byte for byte, survives transient errors and a kill -9, and a dead or wrong server fails fast."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from unittest.mock import ANY

from conftest import GENERATE_STANDIN as STANDIN, REPO
from draftlab.config.config import validate
from draftlab.data.samples import count_samples
from draftlab.util.reporting import RecordingReporter
from draftlab.serve.remote import RemoteGenerator, ServerError
from draftlab.sglang.monitor import free_port
from draftlab.stages import generate
from standin_http import not_found_server



def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file's bytes; the manifest without its fingerprint, which names data.engine (a real server's
    kernels are not the local ones, so its pool is kept apart even when greedy answers agree)."""
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("fingerprint")
    return {**files, "manifest.json": json.dumps(manifest, sort_keys=True).encode()}


@pytest.fixture
def local_pool(tiny_cfg, tmp_path):
    folder = tmp_path / "local"
    generate.run(validate(tiny_cfg("data.samples=32")), folder, {}, RecordingReporter())
    return folder


@pytest.mark.parametrize("api", ["sglang", "vllm"])
def test_greedy_server_samples_are_byte_identical_to_local(api, standin, tiny_cfg, tmp_path, local_pool):
    url = standin("--api", api)
    cfg = validate(tiny_cfg("data.samples=32", "data.engine=server", f"data.server.url='{url}'",
                            "data.server.concurrency=4"))
    folder = tmp_path / "served"
    result = generate.run(cfg, folder, {}, RecordingReporter())
    assert result["generate/new_samples"] == 32
    assert folder_bytes(folder) == folder_bytes(local_pool)


def test_transient_errors_are_retried(standin, tiny_cfg, tmp_path, local_pool):
    url = standin("--api", "sglang", "--fail-every", "3")
    cfg = validate(tiny_cfg("data.samples=32", "data.engine=server", f"data.server.url='{url}'"))
    generate.run(cfg, tmp_path / "served", {}, RecordingReporter())
    assert folder_bytes(tmp_path / "served") == folder_bytes(local_pool)


def test_killed_run_resumes_with_nothing_lost_or_repeated(standin, tiny_cfg, tmp_path, local_pool):
    url = standin("--api", "vllm", "--delay-ms", "150")
    overrides = ["data.samples=32", "data.engine=server", f"data.server.url='{url}'", "data.server.concurrency=2"]
    folder = tmp_path / "killed"
    script = (f"import sys; sys.path[:0] = [{str(REPO / 'tests')!r}, {str(REPO / 'src')!r}]\n"
              "from conftest import compose_config, tiny_overrides\n"
              "from pathlib import Path\n"
              "from draftlab.config.config import validate\nfrom draftlab.util.reporting import NullReporter\n"
              "from draftlab.stages import generate\n"
              f"cfg = validate(compose_config(tiny_overrides(Path({str(tmp_path)!r}), *{overrides!r})))\n"
              f"generate.run(cfg, Path({str(folder)!r}), {{}}, NullReporter())\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while count_samples(folder) < 16:  # the first shard is written; the second is in flight
        assert proc.poll() is None and time.monotonic() < deadline, "the generating process ended too early"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert count_samples(folder) == 16
    resumed = generate.run(validate(tiny_cfg(*overrides)), folder, {}, RecordingReporter())
    assert resumed["generate/new_samples"] == 16
    assert folder_bytes(folder) == folder_bytes(local_pool)


def test_dead_server_fails_fast_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ServerError, match=f"data.server.url: no server answers at {url}"):
        RemoteGenerator(url, eos=[2])
    assert time.monotonic() - started < 5


def test_a_server_that_is_neither_sglang_nor_vllm_is_refused():
    with not_found_server() as url:
        with pytest.raises(ServerError, match=f"{url} is neither SGLang"):
            RemoteGenerator(url, eos=[2])


def test_a_bad_request_is_not_retried(standin):
    url = standin("--api", "vllm")
    client = RemoteGenerator(url, eos=[2], retries=3, backoff_s=5.0)
    client.api = "sglang"  # the wrong API: the server answers 404, which no retry can fix
    started = time.monotonic()
    with pytest.raises(ServerError, match=f"{url}/generate answered 404"):
        client.answer_one([1, 2, 3], 4, 0.0, 0)
    assert time.monotonic() - started < 2


def test_server_engine_keys_are_checked(tiny_cfg):
    from draftlab.config.config import ConfigError

    with pytest.raises(ConfigError, match="data.engine"):
        validate(tiny_cfg("data.engine=vllm"))
    with pytest.raises(ConfigError, match="data.server.url"):
        validate(tiny_cfg("data.engine=server", "data.server.url=localhost:30000"))
    with pytest.raises(ConfigError, match="data.server.url: required with target=tiny"):
        validate(tiny_cfg("data.engine=server"))


def test_without_a_url_draftlab_starts_the_server_itself_and_stops_it(tiny_cfg, tmp_path, local_pool, monkeypatch):
    """data.server.url unset: the SGLang launch builder and start-up monitor start the server (here the
    stand-in, through serve.python) for the target, and it is stopped when the stage ends."""
    import stat

    from omegaconf import OmegaConf

    import draftlab.target.target

    launcher = tmp_path / "python-with-sglang"
    launcher.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv = [{str(STANDIN)!r}, '--api', 'sglang',"
                        " *sys.argv[1:]]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    launcher.chmod(launcher.stat().st_mode | stat.S_IEXEC)
    cfg = validate(tiny_cfg("data.samples=32", "data.engine=server", "data.server.url='http://unused:1'",
                            f"serve.python={launcher}", "serve.startup_timeout_s=60"))
    cfg = OmegaConf.create(OmegaConf.to_container(cfg))
    cfg.data.server.url = None  # the tiny target has no folder an engine could load: pretend it has one
    monkeypatch.setattr(draftlab.target.target, "serving_path", lambda target_cfg, cache_dir: "tiny")
    folder = tmp_path / "served"
    generate.run(cfg, folder, {}, RecordingReporter())
    assert folder_bytes(folder) == {**folder_bytes(local_pool)} | {"sglang-generate.log": ANY}
    log = (folder / "sglang-generate.log").read_text()
    port = int(log.split("PORT ")[1].split()[0])
    with pytest.raises(ServerError, match="no server answers"):  # stopped with the stage
        RemoteGenerator(f"http://127.0.0.1:{port}", eos=[2])


PROBE = """
import json, sys
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
out = []
for body in json.loads(sys.argv[1]):
    try:
        GenerateReqInput(**body).normalize_batch_and_arguments()
        params = SamplingParams(**body["sampling_params"])
        params.verify(320)
        params.normalize(None)
        out.append({"stop_token_ids": sorted(params.stop_token_ids), "max_new_tokens": params.max_new_tokens})
    except Exception as err:
        out.append({"error": type(err).__name__})
print(json.dumps(out))
"""


@pytest.mark.sglang
def test_the_sglang_request_is_what_sglangs_own_classes_accept():
    """Our /generate body goes through the real sglang 0.5.23 GenerateReqInput and SamplingParams."""
    import json

    from draftlab.serve.remote import sglang_body
    from draftlab.sglang.contract import sglang_python

    python = sglang_python()
    if python is None:
        pytest.skip("no sglang venv: run scripts/setup-sglang.sh")
    bodies = [sglang_body([1, 2, 3], 8, 0.0, [2], 5), sglang_body([1, 2, 3], 8, 0.7, [2, 3], 5)]
    misspelt = sglang_body([1, 2, 3], 8, 0.0, [2], 5)
    misspelt["sampling_params"]["max_tokens"] = 8  # vLLM's name: SGLang must refuse it (the probe can fail)
    result = subprocess.run([str(python), "-c", PROBE, json.dumps([*bodies, misspelt])], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    greedy, sampled, wrong = json.loads(result.stdout.strip().splitlines()[-1])
    assert greedy == {"stop_token_ids": [2], "max_new_tokens": 8}
    assert sampled == {"stop_token_ids": [2, 3], "max_new_tokens": 8}
    assert "error" in wrong

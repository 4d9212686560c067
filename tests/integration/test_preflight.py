"""Bad data is refused before any stage, in one line that names the key, file or line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, tiny_overrides
from draftlab.config.config import ConfigError, validate
from draftlab.checks.preflight import preflight


def jsonl(path: Path, n: int, start: int = 0) -> Path:
    path.write_text("".join(json.dumps({"id": f"c{i}", "prompt": f"question number {i}"}) + "\n"
                            for i in range(start, start + n)))
    return path


def refused(tiny_cfg, *overrides) -> str:
    with pytest.raises(ConfigError) as info:
        preflight(validate(tiny_cfg(*overrides)))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_good_file_passes(tiny_cfg, tmp_path):
    preflight(validate(tiny_cfg("data.source=jsonl", f"data.path={jsonl(tmp_path / 'p.jsonl', 64)}")))


def test_non_utf8_byte_names_file_and_line(tiny_cfg, tmp_path):
    path = jsonl(tmp_path / "p.jsonl", 64)
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b"question", b"qu\xe9stion")
    path.write_bytes(b"\n".join(lines))
    message = refused(tiny_cfg, "data.source=jsonl", f"data.path={path}")
    assert message.startswith("data.path: ") and f"{path}:3: not UTF-8 (byte 0xe9" in message


def test_invalid_json_names_file_and_line(tiny_cfg, tmp_path):
    path = jsonl(tmp_path / "p.jsonl", 64)
    path.write_text(path.read_text().replace('"c1", "prompt"', '"c1" "prompt"'))
    assert f"{path}:2: invalid JSON" in refused(tiny_cfg, "data.source=jsonl", f"data.path={path}")


def test_jsonl_read_as_sharegpt_gets_a_hint(tiny_cfg, tmp_path):
    path = jsonl(tmp_path / "x.jsonl", 64)
    message = refused(tiny_cfg, f"data.path={path}")
    assert "not a JSON array" in message and "data.source=jsonl" in message


def test_missing_prompt_file(tiny_cfg, tmp_path):
    message = refused(tiny_cfg, "data.source=jsonl", f"data.path={tmp_path / 'nope.jsonl'}")
    assert message.startswith("data.path: ") and "does not exist" in message


def test_too_few_prompts_for_samples(tiny_cfg, tmp_path):
    message = refused(tiny_cfg, "data.source=jsonl", f"data.path={jsonl(tmp_path / 'p.jsonl', 20)}")
    assert message.startswith("data.samples: 32 asked") and "only 20" in message


def test_too_few_prompts_within_max_prompt_tokens(tiny_cfg, tmp_path):
    path = jsonl(tmp_path / "p.jsonl", 64)
    message = refused(tiny_cfg, "data.source=jsonl", f"data.path={path}", "data.max_prompt_tokens=8")
    assert "only 0 unique prompts within data.max_prompt_tokens=8" in message


def test_a_validation_set_larger_than_the_held_out_prompts_names_data_val_samples(tiny_cfg, tmp_path):
    path = jsonl(tmp_path / "p.jsonl", 40)
    message = refused(tiny_cfg, "data.source=jsonl", f"data.path={path}", "data.samples=8", "data.val_samples=30")
    assert message.startswith("data.val_samples: 30 asked") and "held-out" in message


def test_bench_prompts_beyond_the_held_out_split_is_refused(tiny_cfg, tmp_path):
    path = jsonl(tmp_path / "p.jsonl", 64)
    message = refused(tiny_cfg, "data.source=jsonl", f"data.path={path}", "data.samples=8", "bench.prompts=20",
                      "bench.sets=[sharegpt_val]")
    assert message.startswith("bench.prompts: 20, but only"), message


def test_zero_val_fraction_is_refused_up_front(tiny_cfg):
    assert refused(tiny_cfg, "data.val_fraction=0").startswith("data.val_fraction: 0")


def test_tiny_val_fraction_leaving_no_validation_prompt(tiny_cfg, tmp_path):
    path = jsonl(tmp_path / "p.jsonl", 64)
    assert refused(tiny_cfg, "data.source=jsonl", f"data.path={path}", "data.val_fraction=0.0001",
                   "data.samples=8").startswith("data.val_fraction: 0.0001 puts none")


def test_a_pool_root_that_cannot_be_a_folder_is_refused_up_front(tiny_cfg, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    message = refused(tiny_cfg, f"extract.pool_root={blocker / 'pool'}")
    assert message.startswith("extract.pool_root:") and "extract.pool_root=null" in message
    preflight(validate(tiny_cfg(f"extract.pool_root={tmp_path / 'pool'}")))  # made on the way
    assert (tmp_path / "pool").is_dir()


def test_target_path_ignored_by_tiny_is_refused(tiny_cfg):
    assert refused(tiny_cfg, "target.path=/nonexistent").startswith("target.path: /nonexistent is not used by "
                                                                     "target=tiny")


def test_missing_hf_folder_does_not_exist(tiny_cfg, tmp_path):
    message = refused(tiny_cfg, "target=hf", f"target.path={tmp_path / 'nope'}", "draft.vocab_size=64")
    assert message.startswith("target.path: ") and "does not exist" in message


def test_hf_folder_without_config(tiny_cfg, tmp_path):
    (tmp_path / "model").mkdir()
    assert "has no config.json" in refused(tiny_cfg, "target=hf", f"target.path={tmp_path / 'model'}")


def test_run_py_error_is_one_line_exit_2_before_any_stage_or_run(tmp_path):
    """The console gets one line, the job's run.log the traceback; no stage folder and no MLflow run exist."""
    overrides = tiny_overrides(tmp_path, "data.val_fraction=0", f"hydra.run.dir={tmp_path / 'job'}")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, str(REPO / "src" / "run.py"), *overrides], capture_output=True,
                          text=True, env=env, timeout=300)
    console = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, console
    assert "Traceback" not in console
    errors = [line for line in console.splitlines() if "data.val_fraction" in line]
    assert len(errors) == 1 and "config error" in errors[0], console
    assert "Traceback" in (tmp_path / "job" / "run.log").read_text()
    assert not (tmp_path / "out" / "generate").exists()
    assert not (tmp_path / "mlflow.db").exists()


def test_prompts_are_not_read_again_once_the_pool_holds_them(tiny_cfg, monkeypatch):
    """An all-cached rerun stays fast: the prompt file was checked when the pool was made."""
    import draftlab.data.prompts as prompts
    from draftlab.pipeline import run_stages
    from draftlab.util.reporting import NullReporter

    cfg = validate(tiny_cfg("data.samples=8", "tracking.enabled=false"))
    run_stages(cfg, NullReporter(), names=["generate"])
    monkeypatch.setattr(prompts, "load_prompts", lambda *a, **k: pytest.fail("prompts read again"))
    preflight(cfg)
    with pytest.raises(pytest.fail.Exception):
        preflight(validate(tiny_cfg("data.samples=16", "tracking.enabled=false")))  # the pool must grow


@pytest.mark.parametrize("samples, val_samples, size", [(8, 0, 8), (8, None, 8), (1600, 1000, 2600)])
def test_the_pool_holds_the_training_samples_and_the_validation_set(samples, val_samples, size):
    from types import SimpleNamespace

    from draftlab.data.pool import pool_size

    assert pool_size(SimpleNamespace(samples=samples, val_samples=val_samples)) == size


def test_a_cached_preflight_does_not_import_torch(tiny_cfg, tmp_path):
    """Importing torch costs an all-cached rerun 1.6 s on the CPU: the checks of a pool that exists need none."""
    from omegaconf import OmegaConf

    from draftlab.pipeline import run_stages
    from draftlab.util.reporting import NullReporter

    cfg = validate(tiny_cfg("data.samples=8", "tracking.enabled=false"))
    run_stages(cfg, NullReporter(), names=["generate"])
    OmegaConf.save(cfg, tmp_path / "cfg.yaml")
    code = ("import sys; from omegaconf import OmegaConf; from draftlab.checks.preflight import preflight; "
            f"preflight(OmegaConf.load({str(tmp_path / 'cfg.yaml')!r})); print(sorted(m for m in sys.modules "
            "if m.split('.')[0] == 'torch')[:3])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_byte_order_mark_passes(tiny_cfg, tmp_path):
    path = jsonl(tmp_path / "p.jsonl", 64)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    preflight(validate(tiny_cfg("data.source=jsonl", f"data.path={path}")))


def test_dead_server_url_is_refused_after_one_connection_attempt(tiny_cfg):
    message = refused(tiny_cfg, "data.engine=server", "data.server.url=http://127.0.0.1:9")
    assert message.startswith("data.server.url: no server answers at http://127.0.0.1:9")


def test_paths_root_is_made_only_where_its_parent_exists(tiny_cfg, tmp_path, caplog):
    message = refused(tiny_cfg, f"paths.root={tmp_path / 'typo' / 'deeper'}")
    assert message.startswith("paths.root:") and "does not exist" in message and not (tmp_path / "typo").exists()
    assert "cannot make /proc/x" in refused(tiny_cfg, "paths.root=/proc/x")
    (tmp_path / "a-file").write_text("")
    assert "is a file" in refused(tiny_cfg, f"paths.root={tmp_path / 'a-file'}")
    with caplog.at_level("INFO", logger="draftlab"):
        preflight(validate(tiny_cfg(f"paths.root={tmp_path / 'new'}")))
    assert (tmp_path / "new").is_dir() and f"made the folder {tmp_path / 'new'}" in caplog.text


def test_a_cuda_device_on_a_machine_without_one_is_refused(tiny_cfg, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = refused(tiny_cfg, "train.device=cuda")
    assert message.startswith("train.device: cuda, but torch sees no CUDA device")
    assert refused(tiny_cfg, "target.device=gpu").startswith("target.device: 'gpu' is not a device")
    preflight(validate(tiny_cfg("train.device=cuda", "stages=[generate,extract]")))  # train does not run


def test_a_frozen_head_on_a_draft_of_another_width_is_refused_up_front(tiny_cfg):
    """train.freeze_lm_head keeps the target head's rows, which only a draft of the target's width can hold."""
    message = refused(tiny_cfg, "train.freeze_lm_head=true", "draft.hidden_size=8")
    assert message.startswith("train.freeze_lm_head:") and "draft.hidden_size" in message
    preflight(validate(tiny_cfg("train.freeze_lm_head=true")))  # the target's width (draft.hidden_size unset)

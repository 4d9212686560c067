"""The keys each stage reads are the keys its cache key covers: every stage runs on a config that records each
key accessed, and nothing outside its declared `reads` (or the settings that never shape outputs) may show up."""

import pytest
from omegaconf import DictConfig

from conftest import compose_config
from draftlab import stages
from draftlab.plan.stage_keys import NOT_FINGERPRINTED, NOT_OUTPUT_SETTINGS, STAGES, plan
from draftlab.task import run_task


def _leaves(keys: set[str]) -> set[str]:
    """Accessed keys that are not just a step on the way to a deeper one (`cfg.data` before `data.samples`)."""
    return {k for k in keys if not any(other.startswith(k + ".") for other in keys)}


def _covered(key: str, declared: set[str]) -> bool:
    return any(key == d or key.startswith(d + ".") for d in declared)


@pytest.fixture
def accessed(monkeypatch):
    """stage name -> every config key read while that stage ran."""
    seen: dict[str, set[str]] = {}
    current: list[str] = []
    real_get, real_function = DictConfig._get_impl, stages.stage_function

    def recording_get(self, key, default_value, validate_key=True):
        if current:
            seen.setdefault(current[-1], set()).add(self._get_full_key(key))
        return real_get(self, key, default_value, validate_key)

    def recording_function(name):
        run = real_function(name)

        def wrapped(*args, **kwargs):
            current.append(name)
            try:
                return run(*args, **kwargs)
            finally:
                current.pop()
        return wrapped

    monkeypatch.setattr(DictConfig, "_get_impl", recording_get)
    monkeypatch.setattr(stages, "stage_function", recording_function)
    return seen


def test_every_key_a_stage_reads_is_in_its_cache_key(tiny_cfg, accessed):
    run_task(tiny_cfg("data.samples=16", "tracking.enabled=false"))
    assert set(accessed) == set(STAGES)
    undeclared = {}
    for name, spec in STAGES.items():
        declared = set(spec.reads + spec.grows_with + spec.when_set) | set(NOT_OUTPUT_SETTINGS) | NOT_FINGERPRINTED
        undeclared[name] = sorted(k for k in _leaves(accessed[name]) if not _covered(k, declared))
    assert not any(undeclared.values()), f"keys read but missing from StageSpec.reads: {undeclared}"


# Declared keys a tiny-target run does not read: the target's files are read only for target=hf / gguf.
READ_BY_OTHER_TARGETS = {"target.path", "target.gguf_file"}


def test_every_declared_key_is_read(tiny_cfg, accessed):
    """The other direction: a declared key that no stage code reads only splits caches for nothing."""
    run_task(tiny_cfg("data.samples=16", "tracking.enabled=false"))
    unread = {}
    for name, spec in STAGES.items():
        keys = accessed[name]
        unread[name] = sorted(d for d in set(spec.reads + spec.grows_with) - READ_BY_OTHER_TARGETS
                              if not any(k == d or k.startswith(d + ".") for k in keys))
    assert not any(unread.values()), f"declared in StageSpec.reads but never read: {unread}"


def test_the_recorder_sees_a_read(tiny_cfg, accessed, monkeypatch):
    """The check above can fail: a stage that reads an undeclared key is caught."""
    from draftlab.stages import generate

    real = generate.run

    def snooping(cfg, *args):
        _ = cfg.train.lr  # generate has no business reading this
        return real(cfg, *args)

    monkeypatch.setattr(generate, "run", snooping)
    run_task(tiny_cfg("data.samples=8", "stages=[generate]", "tracking.enabled=false"))
    assert "train.lr" in accessed["generate"]
    assert not _covered("train.lr", set(STAGES["generate"].reads))


def test_the_launch_settings_key_the_pool_only_when_generate_starts_the_server(tmp_path):
    """data.engine=server without a URL: draftlab launches SGLang with serve.dtype/tp_size/extra_args, which can
    change the answers, so they name the pool; with a URL, or generating locally, they do not."""

    def key(*overrides: str) -> str:
        return plan(compose_config([f"paths.root={tmp_path}", *overrides]))["generate"].folder_key

    own = ("data.engine=server",)
    assert key(*own) != key(*own, "serve.dtype=float16") != key(*own, "serve.tp_size=2")
    url = (*own, "data.server.url=http://127.0.0.1:30000")
    assert key(*url) == key(*url, "serve.dtype=float16")
    assert key() == key("serve.dtype=float16") and key() != key(*own)

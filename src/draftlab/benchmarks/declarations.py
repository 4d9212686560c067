"""The benchmarks declared in conf/benchmark/: one YAML file each, composed with Hydra so that a run takes
overrides as `src/run.py` does (`args.steps=20`, `device=gpu`).

A declaration holds:
- `device` (cpu | gpu: where it is meant to run), `goal` (the sentence), `metric` (the number that decides it),
  `higher_is_better` and `goal_value` (optional: the metric's threshold);
- `command` (an argument list), `args` (rendered after it: `--key value` flags, or `key=value` for `src/run.py`
  when `arg_style: hydra`), `extra` (appended as is), `setup` (commands run first), `env` (added variables);
- `read`: how numbers come back: `json_lines` (the JSON objects the command prints, the last one matching `select`
  deciding) or `run_results` (the metrics of the newest results.json matching `results_glob` under the run's folder).
Strings may hold `{python}` (this interpreter), `{repo}` (the checkout), `{out}` (the run's folder) and
`{glob:PATTERN}` (the first match of PATTERN under `{out}`, for folders named by a stage's key); an argument
left `{required}` must be given on the command line.

`keep`: glob patterns under the run's folder; the newest match of each is copied beside results.json (the raw
table a result's intervals are re-derived from: the bench stage's per_prompt.json).

`reference`: the same measurement of another commit of this repository, so that one command gives the ratio a
goal like "5x the reference's" is stated in. It holds `commit`, `metric` (the reference's number), `compare` (this
checkout's number over it; default the declaration's metric, or `metric` where that is `ratio`) and its own
`command`, `args`, `arg_style`, `extra`, `setup`, `env`, `read`, `select`, `results_glob` (each but `args`
defaulting to the declaration's). It runs in a temporary detached worktree of that commit, on the same machine,
after this checkout's command; `{repo}` is that worktree there and `{head}` this checkout, whose scripts may run
the older code. The numbers come back as `reference.NAME` beside `ratio`, which a declaration may decide on.

`hardware=cpu|gpu` among the overrides picks the declaration for that machine, as `src/run.py hardware=gpu` picks
the preset: `peers hardware=gpu` runs `peers_gpu`.
"""

from __future__ import annotations

import glob
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from draftlab.tracking.run_context import repo_root

READ_KINDS = ("json_lines", "run_results")
HARDWARE = ("cpu", "gpu")
REQUIRED = "{required}"
GLOB = re.compile(r"\{glob:([^}]+)\}")


@dataclass
class Benchmark:
    name: str
    device: str
    goal: str
    metric: str
    read: str
    command: list[str]
    higher_is_better: bool = True
    goal_value: float | None = None
    args: dict = field(default_factory=dict)
    arg_style: str = "flags"
    extra: list[str] = field(default_factory=list)
    setup: list[list[str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    select: dict = field(default_factory=dict)
    results_glob: str = "root/runs/*/results.json"
    keep: list[str] = field(default_factory=list)
    reference: dict | None = None

    def met(self, value: float | None) -> bool | None:
        """Whether `value` meets `goal_value` (None when either is unknown)."""
        if value is None or self.goal_value is None:
            return None
        return value >= self.goal_value if self.higher_is_better else value <= self.goal_value


def folder(root: Path | None = None) -> Path:
    return (root or repo_root()) / "conf" / "benchmark"


def names(root: Path | None = None) -> list[str]:
    return sorted(p.stem for p in folder(root).glob("*.yaml"))


def compose(name: str, overrides: list[str] | None = None, root: Path | None = None) -> Benchmark:
    """The declaration `name` with Hydra `overrides` applied. Raises ValueError for an unknown name or a bad one."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    known = names(root)
    if name not in known:
        raise ValueError(f"no benchmark {name!r}; declared: {', '.join(known)}")
    name, overrides, hardware = _for_hardware(name, list(overrides or []), known)
    GlobalHydra.instance().clear()
    try:  # a misspelt or malformed override: one line naming it, not Hydra's traceback
        with initialize_config_dir(config_dir=str(folder(root)), version_base="1.3"):
            cfg = hydra_compose(config_name=name, overrides=overrides)
        data = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ValueError(f"{name}: {' '.join(str(err).strip().splitlines()[:2])}") from None
    if data.get("read") not in READ_KINDS:
        raise ValueError(f"benchmark {name}: read must be one of {READ_KINDS}, not {data.get('read')!r}")
    known_fields = set(Benchmark.__dataclass_fields__) - {"name"}
    unknown = sorted(set(data) - known_fields)
    if unknown:
        raise ValueError(f"benchmark {name}: unknown keys {unknown}")
    bench = Benchmark(name=name, **data)
    if bench.reference is not None:
        _check_reference(bench)
    if hardware is not None and bench.device != hardware:
        raise ValueError(f"hardware={hardware}: benchmark {name} runs on {bench.device}, and no declaration of it "
                         f"runs on {hardware}")
    return bench


REFERENCE_KEYS = {"commit", "metric", "compare", "command", "args", "arg_style", "extra", "setup", "env", "read",
                  "select", "results_glob"}


def _check_reference(bench: Benchmark) -> None:
    ref = bench.reference
    unknown = sorted(set(ref) - REFERENCE_KEYS)
    if unknown:
        raise ValueError(f"benchmark {bench.name}: unknown reference keys {unknown}")
    for key in ("commit", "metric"):
        if not ref.get(key):
            raise ValueError(f"benchmark {bench.name}: reference needs {key}")
    if ref.get("read", bench.read) not in READ_KINDS:
        raise ValueError(f"benchmark {bench.name}: reference read must be one of {READ_KINDS}")


def reference_benchmark(bench: Benchmark) -> Benchmark:
    """The reference block as a Benchmark of its own, so that the reference runs and is read as `bench` is."""
    ref = bench.reference or {}
    inherited = {key: ref.get(key, getattr(bench, key))
                 for key in ("command", "arg_style", "extra", "setup", "env", "read", "select", "results_glob")}
    return Benchmark(name=f"{bench.name}.reference", device=bench.device, goal=bench.goal, metric=ref["metric"],
                     args=dict(ref.get("args") or {}), **inherited)


def _for_hardware(name: str, overrides: list[str], known: list[str]) -> tuple[str, list[str], str | None]:
    """(the declaration that `hardware=` picks, the other overrides, the machine asked for or None)."""
    asked = [item.split("=", 1)[1] for item in overrides if item.startswith("hardware=")]
    if not asked:
        return name, overrides, None
    hardware = asked[-1]
    if hardware not in HARDWARE:
        raise ValueError(f"hardware must be one of {', '.join(HARDWARE)}, not {hardware!r}")
    wanted = name.removesuffix("_gpu") + ("_gpu" if hardware == "gpu" else "")
    rest = [item for item in overrides if not item.startswith("hardware=")]
    return (wanted if wanted in known else name), rest, hardware


def missing(bench: Benchmark) -> list[str]:
    """The `args` keys still `{required}`: what the caller must give (`args.draft=DIR`). Not OmegaConf's `???`,
    which a declaration's merge onto its parent's value would drop."""
    return [f"args.{key}" for key, value in _flat(bench.args) if value == REQUIRED]


def _flat(mapping: dict, prefix: str = "") -> list[tuple[str, object]]:
    items = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            items += _flat(value, f"{prefix}{key}.")
        else:
            items.append((f"{prefix}{key}", value))
    return items


def render_args(bench: Benchmark) -> list[str]:
    """`args` as command-line arguments: null and false are left out."""
    argv: list[str] = []
    for key, value in _flat(bench.args):
        if value is None or (value is False and bench.arg_style == "flags"):
            continue
        if bench.arg_style == "hydra":
            text = str(value).lower() if isinstance(value, bool) else str(value)
            argv.append(f"{key}={text}")
        elif value is True:
            argv.append("--" + key.replace("_", "-"))
        else:
            values = value if isinstance(value, list) else [value]
            argv += ["--" + key.replace("_", "-"), *map(str, values)]
    return argv


def fill(text: str, out: Path, root: Path | None = None, head: Path | None = None) -> str:
    """The placeholders of one string filled in (see the module's docstring)."""
    text = text.replace("{python}", sys.executable).replace("{repo}", str(root or repo_root()))
    text = text.replace("{head}", str(head or root or repo_root()))
    text = text.replace("{out}", str(out))

    def first(match: re.Match) -> str:
        found = sorted(glob.glob(str(out / match.group(1))))
        if not found:
            raise FileNotFoundError(f"nothing matches {match.group(1)} under {out}")
        return found[0]

    return GLOB.sub(first, text)


def commands(bench: Benchmark, out: Path, root: Path | None = None,
             head: Path | None = None) -> tuple[list[list[str]], list[str]]:
    """(setup commands, the measured command) with their placeholders filled in. The measured one is filled
    after the setup has run (see `main_command`), since `{glob:...}` may name what the setup made."""
    setup = [[fill(str(part), out, root, head) for part in cmd] for cmd in bench.setup]
    return setup, [*bench.command, *render_args(bench), *bench.extra]


def main_command(raw: list[str], out: Path, root: Path | None = None, head: Path | None = None) -> list[str]:
    return [fill(str(part), out, root, head) for part in raw]

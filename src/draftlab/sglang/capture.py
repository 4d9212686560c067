"""SGLang's EAGLE-3 capture contract, one file per supported SGLang version (`capture_<version>.json`, read from
that version's model files by capture_reader.py): for the target's architecture, which hidden states the server
feeds the draft for the ids in its config.

draftlab's layer ids are the ids written to `eagle_config.eagle_aux_hidden_state_layer_ids`. A capture point c is
the residual stream entering decoder layer c (HF `hidden_states[c]`; c = L is the last layer's output before the
final norm). Extraction, the local engine and check-draft all go through `ArchCapture.points`, so the features a
draft learns on are the ones the server captures for the same ids.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from draftlab.config.config import ConfigError
from draftlab.target.target_shape import text_config

# `capture_<version>.json` beside this module: code_version counts `<module>_*.json` as this module's code, so
# a regenerated contract changes the fingerprint of every stage that reads it
HERE = Path(__file__).parent
CONTRACT_NAME = re.compile(r"capture_(\d+(?:\.\d+)+)\.json")
VERSION_KEY = "serve.sglang_version"
# The id rules SGLang's model files use; capture_reader's `derive_rule` keeps the one every probe agrees with.
RULES = {
    "plus1": lambda ids, L: [i + 1 for i in ids],
    "plus1_if_first_is_1": lambda ids, L: [i + 1 for i in ids] if ids and ids[0] == 1 else list(ids),
    "as_is_if_max_is_L": lambda ids, L: list(ids) if ids and max(ids) == L else [i + 1 for i in ids],
    "as_is": lambda ids, L: list(ids),
}

ALLOW_KEY = "target.allow_unlisted_arch"
FALLBACK = {"captures": True, "ids": "plus1", "default": ["2", "L//2", "L-3"], "last_layer": False}


class CaptureError(ConfigError):
    """The target cannot feed an EAGLE-3 draft under SGLang (a config error: refused before any stage runs)."""


def contract_path(version: str) -> Path:
    return HERE / f"capture_{version}.json"


def shipped_versions() -> list[str]:
    """The SGLang versions with a contract here, oldest first."""
    found = [m.group(1) for p in HERE.glob("capture_*.json") if (m := CONTRACT_NAME.fullmatch(p.name))]
    return sorted(found, key=lambda v: tuple(int(x) for x in v.split(".")))


def installed_version() -> str | None:
    """The version of the sglang package this interpreter has, from its metadata (sglang is never imported)."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def resolve_version(requested: str | None = None) -> str:
    """The SGLang version whose contract applies: `requested` (serve.sglang_version), else the installed sglang's,
    else the newest shipped; CaptureError when there is no contract for it."""
    shipped = shipped_versions()
    version = str(requested) if requested is not None else installed_version() or shipped[-1]
    if version not in shipped:
        source = f"{VERSION_KEY}={version}" if requested is not None else f"the installed sglang {version}"
        raise CaptureError(f"{VERSION_KEY}: no capture contract for {source}; shipped: {', '.join(shipped)}")
    return version


@lru_cache(maxsize=None)
def contract(version: str | None = None) -> dict:
    return json.loads(contract_path(resolve_version(version)).read_text())


def _term(term: str, L: int) -> int:
    base, _, offset = term.replace("-", "+-").partition("+") if term[0] == "L" else ("", "", term)
    value = {"": 0, "L//2": L // 2, "L": L}[base]
    return value + (int(offset) if offset else 0)


def derive_rule(table: list[tuple[int, list[int], list[int]]]) -> str | None:
    """The one rule of RULES that maps every probe's ids (on its L) to what the method stored; None if not one."""
    agreeing = [name for name, rule in RULES.items() if all(rule(ids, L) == got for L, ids, got in table)]
    return agreeing[0] if len(agreeing) == 1 else None


def derive_default(defaults: dict[int, list[int]]) -> list[str] | None:
    """Each default index as `c`, `L//2+c` or `L+c`, whichever holds at every probed layer count."""
    terms = []
    for j in range(len(next(iter(defaults.values())))):
        for form in ("", "L//2", "L"):
            base = {L: 0 if form == "" else (L // 2 if form == "L//2" else L) for L in defaults}
            offsets = {defaults[L][j] - base[L] for L in defaults}
            if len(offsets) == 1:
                c = offsets.pop()
                terms.append(str(c) if not form else form + ("" if c == 0 else f"{c:+d}"))
                break
        else:
            return None
    return terms


@dataclass(frozen=True)
class ArchCapture:
    arch: str
    entry: dict
    version: str
    listed: bool = True

    @property
    def rule(self) -> str:
        return self.entry["ids"]

    @property
    def wraps(self) -> str | None:
        return self.entry.get("wraps")

    def points(self, ids: list[int], num_layers: int) -> list[int]:
        """The capture points SGLang derives from `ids` on an L-layer target."""
        return RULES[self.rule](list(ids), int(num_layers))

    def default_ids(self, num_layers: int) -> list[int]:
        """Ids whose capture points are SGLang's default (what it captures when the draft names none)."""
        L = int(num_layers)
        wanted = [_term(t, L) for t in self.entry["default"]]
        for ids in ([c - 1 for c in wanted], wanted):
            if self.points(ids, L) == wanted:
                return ids
        raise CaptureError(f"extract.layers=auto: no ids give {self.arch}'s default capture {wanted} "
                           f"(SGLang {self.version}); list the ids")

    def top(self, num_layers: int) -> int:
        """The last capture point SGLang reaches on an L-layer target: L only where the class captures after its
        last layer, else L - 1 (the loop over layers never meets index L)."""
        return int(num_layers) if self.entry.get("last_layer") else int(num_layers) - 1

    def describe(self) -> str:
        rule = {"plus1": "id k -> output of layer k (+1)",
                "plus1_if_first_is_1": "+1 only when the first id is 1, else id k -> output of layer k-1",
                "as_is_if_max_is_L": "+1 unless the largest id is L (then as-is)",
                "as_is": "id k -> output of layer k-1 (as-is)"}.get(self.rule, self.rule)
        via = f" via {self.wraps}" if self.wraps else ""
        listed = "" if self.listed else f" (not in the contract: {ALLOW_KEY}=true)"
        return f"{self.arch}{via}, SGLang {self.version}: {rule}{listed}"


def llama(version: str | None = None) -> ArchCapture:
    """Llama's contract: what the tiny and embedded targets follow, and the fallback where no target is known."""
    return for_target({"architectures": ["LlamaForCausalLM"]}, version=version)


def architecture(config: dict) -> str | None:
    """The class SGLang would serve: `architectures[0]`, else transformers' causal-LM class for `model_type`."""
    archs = config.get("architectures") or []
    if archs:
        return archs[0]
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return None
    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type"))


def for_target(config: dict, allow_unlisted: bool = False, data: dict | None = None,
               version: str | None = None) -> ArchCapture:
    """The capture contract of the target whose config.json is `config` (in `data`, else the shipped contract of
    SGLang `version`: see `resolve_version`); CaptureError when that SGLang cannot feed it a three-layer draft,
    naming the class, the SGLang version and why."""
    data = data or contract(version)
    version = data["sglang_version"]
    arch = architecture(config) or f"model_type {config.get('model_type')!r}"
    entry = data["architectures"].get(arch)
    hidden = text_config(config).get("hidden_size", "hidden_size")
    wanted = f"3 x {hidden} = {3 * hidden}" if isinstance(hidden, int) else "3 x hidden_size"
    if entry is None:
        if allow_unlisted:
            return ArchCapture(arch, FALLBACK, version, listed=False)
        raise CaptureError(f"target architecture {arch} is not in draftlab's SGLang capture contract (SGLang "
                           f"{version}, {len(data['architectures'])} classes): set {ALLOW_KEY}=true to extract "
                           "with the Llama convention (id k = output of layer k) at your own risk")
    if entry["captures"] is True:
        return ArchCapture(arch, entry, version)
    if entry["captures"] is None and allow_unlisted:
        return ArchCapture(arch, FALLBACK, version, listed=False)
    head = f"target class {arch} ({entry['file']}, SGLang {version}) cannot feed an EAGLE-3 draft: {entry['why']}"
    server = data.get("without_method")
    if "method_in" not in entry and server:  # no capture method: the model runner stops before serving
        verb = "refuses to start" if server["checked"] else "fails at start-up"
        raise CaptureError(f"{head}; SGLang {version}'s server {verb} with it ({server['error']} in "
                           f"{server['where']})")
    override = f"; {ALLOW_KEY}=true accepts it at your own risk" if entry["captures"] is None else ""
    raise CaptureError(f"{head}, so it would not get the {wanted} features it expects{override}")

"""Reads SGLang's own model files and derives, per served architecture, how EAGLE-3 auxiliary states are captured.

Nothing here is written by hand per model: every class registered in an `EntryClass` list is resolved through its
bases (by the files' own imports), and its `set_eagle3_layers_to_capture` is executed, as written in SGLang, on a
recording stand-in for `self` with probe id lists. What it stores into `layers_to_capture` (directly, through its
inner model, or through a wrapper's `language_model`) decides the id rule and the default ids. The model files are
parsed, not imported, so no GPU build is needed. `python -m draftlab capture-contract --write` regenerates the file.
"""

from __future__ import annotations

import ast
import builtins
import re
import types
import typing
from pathlib import Path

from draftlab.sglang.capture import RULES

METHOD = "set_eagle3_layers_to_capture"
PROBE_LAYERS = (32, 61, 48)
FINAL_CAPTURE = re.compile(r"\b(self\.end_layer|len\(self\.layers\)|self\.config\.num_hidden_layers)\s+in\s+"
                           r"self\.layers_to_capture")


def probes(L: int) -> list[list[int]]:
    return [[1, L // 2 - 1, L - 4], [2, L // 2, L - 3], [0, 3, L - 1], [3, 5, L], [4, 6, 9]]


class Recorder:
    """Stands in for `self` and everything reached from it; records every attribute set and every call."""

    def __init__(self, path: str, log: list, num_layers: int):
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_L", num_layers)
        if path == "self":
            config = types.SimpleNamespace(num_hidden_layers=num_layers)
            config.text_config = types.SimpleNamespace(num_hidden_layers=num_layers)
            object.__setattr__(self, "config", config)

    def __getattr__(self, name):
        child = Recorder(f"{self._path}.{name}", self._log, self._L)
        object.__setattr__(self, name, child)
        return child

    def __setattr__(self, name, value):
        self._log.append(("set", f"{self._path}.{name}", value))
        object.__setattr__(self, name, value)

    def __getitem__(self, index):
        return Recorder(f"{self._path}[{index}]", self._log, self._L)

    def __iter__(self):
        return iter(())

    def __len__(self):
        return self._L  # len(self.model.layers)

    def __call__(self, *args, **kwargs):
        self._log.append(("call", self._path, list(args) + list(kwargs.values())))
        return Recorder(f"{self._path}()", self._log, self._L)


class ModuleNames(dict):
    """The method's globals: typing's names, and a Recorder for any other module-level name it reaches
    (`get_parallel()`), so that only what it does to `self` is read."""

    def __missing__(self, name):
        return getattr(builtins, name) if hasattr(builtins, name) else Recorder(name, [], 0)


class ModelFiles:
    """The classes of `sglang/srt/models/*.py`, their bases and imports, found by parsing."""

    def __init__(self, models_dir: Path):
        self.dir = Path(models_dir)
        self.classes: dict[tuple[str, str], ast.ClassDef] = {}
        self.imports: dict[str, dict[str, str]] = {}
        self.entries: list[tuple[str, str]] = []
        self.sources: dict[str, str] = {}
        for path in sorted(self.dir.glob("*.py")):
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
            self.sources[path.name] = source
            self.imports[path.name] = {}
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self.classes[(path.name, node.name)] = node
                elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang.srt.models."):
                    for alias in node.names:
                        self.imports[path.name][alias.asname or alias.name] = node.module.rsplit(".", 1)[1] + ".py"
                elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
                    values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                    self.entries += [(path.name, v.id) for v in values if isinstance(v, ast.Name)]

    def resolve(self, name: str, file: str, depth: int = 0):
        if (file, name) in self.classes:
            return file, name
        origin = self.imports.get(file, {}).get(name)
        if origin and depth < 8:
            return self.resolve(name, origin, depth + 1)
        return None

    def mro(self, key) -> list[tuple[str, str]]:
        order, stack = [], [key]
        while stack:
            current = stack.pop(0)
            if current is None or current in order:
                continue
            order.append(current)
            bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", None) for b in self.classes[current].bases]
            stack += [self.resolve(b, current[0]) for b in bases if b]
        return order

    def method(self, key, name: str):
        for owner in self.mro(key):
            for node in self.classes[owner].body:
                if isinstance(node, ast.FunctionDef) and node.name == name:
                    return owner, node
        return None, None

    def attribute_class(self, key, attr: str):
        """The class `__init__` builds into `self.<attr>`: `self.model = LlamaModel(...)`, or through a helper
        method that returns one (`self.model = self._init_model(...)`), searched along the MRO."""
        _, init = self.method(key, "__init__")
        for node in ast.walk(init) if init else ():
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and any(isinstance(t, ast.Attribute) and t.attr == attr and getattr(t.value, "id", "") == "self"
                            for t in node.targets)):
                found = self._built_class(key, node.value)
                if found:
                    return found
        return None

    def _built_class(self, key, call: ast.Call):
        if isinstance(call.func, ast.Name):
            return self.resolve(call.func.id, self.method(key, "__init__")[0][0])
        if isinstance(call.func, ast.Attribute) and getattr(call.func.value, "id", "") == "self":
            owner, helper = self.method(key, call.func.attr)
            for node in ast.walk(helper) if helper else ():
                if isinstance(node, ast.Return) and isinstance(node.value, ast.Call) and isinstance(node.value.func,
                                                                                                  ast.Name):
                    return self.resolve(node.value.func.id, owner[0])
        return None

    def call(self, owner, func: ast.FunctionDef, ids, L: int) -> list:
        """Executes SGLang's method as written, on a Recorder; returns what it recorded."""
        module = ast.Module(body=[func], type_ignores=[])
        namespace = ModuleNames({name: getattr(typing, name) for name in typing.__all__})
        exec(compile(module, f"sglang/srt/models/{owner[0]}", "exec"), namespace)  # noqa: S102 - SGLang's own code
        log: list = []
        namespace[func.name](Recorder("self", log, L), None if ids is None else list(ids))
        return log


def _stored(log: list, path: str):
    return next((value for kind, where, value in reversed(log) if kind == "set" and where == path), None)


def _called(log: list, path: str):
    return next((args for kind, where, args in reversed(log) if kind == "call" and where == path), None)


def capture_indices(files: ModelFiles, key, ids, L: int, depth: int = 0):
    """(indices stored into layers_to_capture, how they got there) for `ids` on an L-layer target; None if none."""
    owner, func = files.method(key, METHOD)
    if func is None or depth > 3:
        return None, None
    log = files.call(owner, func, ids, L)
    for path, how in (("self.model.layers_to_capture", "model"), ("self.layers_to_capture", "self")):
        stored = _stored(log, path)
        if stored is not None:
            return list(stored), how
    inner_args = _called(log, f"self.model.{METHOD}")
    if inner_args is not None:
        inner = files.attribute_class(key, "model")
        inner_owner, inner_func = files.method(inner, METHOD) if inner else (None, None)
        if inner_func is None:
            return None, None
        stored = _stored(files.call(inner_owner, inner_func, inner_args[0], L), "self.layers_to_capture")
        return (None if stored is None else list(stored)), "model"
    delegated = _called(log, f"self.language_model.{METHOD}")
    if delegated is not None:
        inner = files.attribute_class(key, "language_model")
        if inner is None:
            return None, None
        got, _ = capture_indices(files, inner, delegated[0], L, depth + 1)
        return got, f"language_model:{inner[1]}"
    return None, None


def derive_rule(table: list[tuple[int, list[int], list[int]]]) -> str | None:
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


def describe(files: ModelFiles, file: str, name: str) -> dict:
    key = (file, name)
    entry: dict = {"file": file, "class": name}
    owner, func = files.method(key, METHOD)
    if func is None:
        return {**entry, "captures": False, "why": f"{name} and its bases define no {METHOD}"}
    entry["method_in"] = f"{owner[0]}:{owner[1]}"
    try:
        table = [(L, ids, capture_indices(files, key, ids, L)) for L in PROBE_LAYERS for ids in probes(L)]
        defaults = {L: capture_indices(files, key, None, L)[0] for L in PROBE_LAYERS}
    except Exception as err:  # noqa: BLE001 - a method this reader cannot run is recorded, and refused later
        return {**entry, "captures": None, "why": f"{METHOD} could not be read: {type(err).__name__}: {err}"}
    hows = {how for _, _, (_, how) in table}
    if any(got is None for _, _, (got, _) in table) or None in defaults.values():
        why = ("passes the capture to a language_model that does not capture"
               if any(str(h).startswith("language_model") for h in hows) else "stores no layers_to_capture")
        return {**entry, "captures": None, "why": f"{METHOD} {why}"}
    rule = derive_rule([(L, ids, got) for L, ids, (got, _) in table])
    default = derive_default(defaults)
    how = hows.pop() if len(hows) == 1 else None
    if rule is None or default is None or how is None:
        return {**entry, "captures": None, "why": f"{METHOD} follows no known id rule"}
    holder = _capture_holder(files, key, how)
    source = "".join(ast.get_source_segment(files.sources[k[0]], files.classes[k]) or "" for k in files.mro(holder))
    if "in self.layers_to_capture" not in source:
        return {**entry, "captures": False, "why": f"{holder[1]}'s forward never reads layers_to_capture"}
    entry.update(captures=True, ids=rule, default=default, last_layer=bool(FINAL_CAPTURE.search(source)))
    if how.startswith("language_model:"):
        entry["wraps"] = how.split(":", 1)[1]
    return entry


def _capture_holder(files: ModelFiles, key, how: str):
    """The class whose forward reads layers_to_capture: the CausalLM itself, its `model`, or the wrapped LM's."""
    if how.startswith("language_model:"):
        key = files.attribute_class(key, "language_model")
    return key if how == "self" else (files.attribute_class(key, "model") or key)


def read_contract(models_dir: Path, version: str) -> dict:
    files = ModelFiles(models_dir)
    archs = {}
    for file, name in files.entries:
        if (file, name) in files.classes and name not in archs:
            archs[name] = describe(files, file, name)
    return {
        "sglang_version": version,
        "regenerate": "python -m draftlab capture-contract --write",
        "index": "capture index c is the residual stream entering decoder layer c (HF hidden_states[c]); "
                 "c = L, where last_layer is true, is the last layer's output before the final norm",
        "architectures": dict(sorted(archs.items())),
    }


def installed_sglang(python: Path) -> tuple[Path, str]:
    """The models folder and version of the sglang installed for `python`, found without importing sglang."""
    import subprocess

    code = ("import importlib.metadata as m, importlib.util as u, pathlib; s = u.find_spec('sglang'); "
            "print(pathlib.Path(list(s.submodule_search_locations)[0]) / 'srt' / 'models'); print(m.version('sglang'))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, timeout=120)
    folder, version = done.stdout.split()
    return Path(folder), version


def main(argv: list[str]) -> int:
    import json
    import sys

    from draftlab.cli_parser import ArgumentParser
    from draftlab.sglang.capture import CONTRACT
    from draftlab.sglang.contract import sglang_python

    parser = ArgumentParser(prog="python -m draftlab capture-contract",
                            description="Regenerate SGLang's EAGLE-3 capture contract from its model files.")
    parser.add_argument("--write", action="store_true", help=f"write {CONTRACT.name} (default: compare only)")
    parser.add_argument("--python", help="the sglang venv's interpreter (default: scripts/setup-sglang.sh's)")
    args = parser.parse_args(argv)
    python = Path(args.python) if args.python else sglang_python()
    if python is None or not python.is_file():
        print(f"capture-contract: {python or 'no sglang venv'}: no such interpreter (run scripts/setup-sglang.sh "
              "or pass --python)", file=sys.stderr)
        return 2
    text = json.dumps(read_contract(*installed_sglang(python)), indent=1) + "\n"
    if args.write:
        CONTRACT.write_text(text)
        print(f"wrote {CONTRACT}")
        return 0
    same = CONTRACT.exists() and CONTRACT.read_text() == text
    print(f"{CONTRACT.name}: {'same as' if same else 'DIFFERS from'} the installed sglang's model files")
    return 0 if same else 1

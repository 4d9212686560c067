"""Reads SGLang's own model files and derives, per served architecture, how EAGLE-3 auxiliary states are captured.

Nothing here is written by hand per model: every class registered in an `EntryClass` list is resolved through its
bases (by the files' own imports), and its `set_eagle3_layers_to_capture` is executed, as written in SGLang, on a
recording stand-in for `self` with probe id lists. What it stores into `layers_to_capture` (directly, through its
inner model, or through a wrapper's `language_model`) decides the id rule and the default ids. The model files are
parsed, not imported, so no GPU build is needed. `python -m draftlab capture-contract --write` regenerates the
contracts, one per SGLang release (`capture_<version>.json`), each from that release's own model files.
"""

from __future__ import annotations

import ast
import builtins
import types
import typing
from pathlib import Path

from draftlab.sglang.capture import derive_default, derive_rule
from draftlab.sglang.capture_scan import (FINAL_CAPTURE, MARK, METHOD, READS_LIST, forward_source, method_check,
                                          pre_residual)

PROBE_LAYERS = (32, 61, 48)


def probes(L: int) -> list[list[int]]:
    return [[1, L // 2 - 1, L - 4], [2, L // 2, L - 3], [0, 3, L - 1], [3, 5, L], [4, 6, 9]]


class Recorder:
    """Stands in for `self` and everything reached from it; records every attribute set and every call.

    Every guard passes (`if not get_parallel().pp_group.is_last_rank: return` must not end the method): the
    contract is what the last pipeline rank captures. `absent` holds the paths that do not exist on the class the
    reader resolved there, so `hasattr(self.model, METHOD)` answers as it would in SGLang."""

    def __init__(self, path: str, log: list, num_layers: int, absent: frozenset = frozenset()):
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_L", num_layers)
        object.__setattr__(self, "_absent", absent)
        if path == "self":
            config = types.SimpleNamespace(num_hidden_layers=num_layers)
            config.text_config = types.SimpleNamespace(num_hidden_layers=num_layers)
            object.__setattr__(self, "config", config)

    def __getattr__(self, name):
        if f"{self._path}.{name}" in self._absent:
            raise AttributeError(name, name=name, obj=self)
        child = Recorder(f"{self._path}.{name}", self._log, self._L, self._absent)
        object.__setattr__(self, name, child)
        return child

    def __setattr__(self, name, value):
        self._log.append(("set", f"{self._path}.{name}", value))
        object.__setattr__(self, name, value)

    def __getitem__(self, index):
        return Recorder(f"{self._path}[{index}]", self._log, self._L, self._absent)

    def __bool__(self):
        return True

    def __iter__(self):
        return iter(())

    def __len__(self):
        return self._L  # len(self.model.layers)

    def __call__(self, *args, **kwargs):
        self._log.append(("call", self._path, list(args) + list(kwargs.values())))
        return Recorder(f"{self._path}()", self._log, self._L, self._absent)


class ModuleNames(dict):
    """The method's globals: typing's names, and a Recorder for any other module-level name it reaches
    (`get_parallel()`), so that only what it does to `self` is read."""

    def __missing__(self, name):
        return getattr(builtins, name) if hasattr(builtins, name) else Recorder(name, [], 0)


class NoCapture(Exception):
    """A class whose method runs but stores no capture (the reason is the contract's `why`)."""


class ModelFiles:
    """The classes of `sglang/srt/models/*.py`, their bases and imports, found by parsing."""

    def __init__(self, models_dir: Path):
        self.dir = Path(models_dir)
        self.classes: dict[tuple[str, str], ast.ClassDef] = {}
        self.imports: dict[str, dict[str, str]] = {}
        self.entries: list[tuple[str, str]] = []
        self.sources: dict[str, str] = {}
        self.modules: dict[str, dict[str, str]] = {}  # `from sglang.srt.models import qwen3_5`: alias -> file
        for path in sorted(self.dir.glob("*.py")):
            source = path.read_text(encoding="utf-8-sig")  # a few files open with a byte-order mark
            tree = ast.parse(source)
            self.sources[path.name] = source
            self.imports[path.name] = {}
            self.modules[path.name] = {}
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self.classes[(path.name, node.name)] = node
                elif isinstance(node, ast.ImportFrom) and node.module == "sglang.srt.models":
                    self.modules[path.name].update({a.asname or a.name: a.name + ".py" for a in node.names})
                elif isinstance(node, ast.ImportFrom):
                    self.imports[path.name].update(_model_imports(node))
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

    def resolve_in(self, name: str, owner, func: ast.FunctionDef, env: dict | None = None):
        """`name` as seen inside `func` of class `owner`: a parameter bound to a class (`env`), an import inside
        the function (mllama4 imports Llama4ForCausalLM in `__init__`), else the file's own names."""
        if env and name in env:
            return env[name]
        local = {}
        for node in ast.walk(func):
            if isinstance(node, ast.ImportFrom):
                local.update(_model_imports(node))
        return self.resolve(name, local[name]) if name in local else self.resolve(name, owner[0])

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

    def init_chain(self, key) -> list[tuple]:
        """(owner, __init__, env) along the MRO, most derived first. `env` maps a parameter to the class it holds:
        its default, or what the subclass passed to `super().__init__` (Qwen3.5's VL class hands its text model to
        Qwen3-VL's `__init__` as `language_model_cls`)."""
        chain, passed = [], ([], {})
        for owner in self.mro(key):
            init = next((n for n in self.classes[owner].body
                         if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            if init is None:
                continue
            params = [a.arg for a in init.args.args[1:]]
            defaults = dict(zip(params[len(params) - len(init.args.defaults):], init.args.defaults))
            defaults.update({a.arg: d for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults) if d is not None})
            given = dict(zip(params, passed[0])) | passed[1]
            env = {}
            for name in params + [a.arg for a in init.args.kwonlyargs]:
                value = given.get(name) or (self.resolve_in(defaults[name].id, owner, init)
                                            if isinstance(defaults.get(name), ast.Name) else None)
                if value:
                    env[name] = value
            chain.append((owner, init, env))
            passed = self._passed_up(owner, init, env)
        return chain

    def _passed_up(self, owner, init: ast.FunctionDef, env: dict) -> tuple[list, dict]:
        """The classes `init` hands to `super().__init__(...)`, positional and by keyword (None: not a class)."""
        def bound(arg):
            return self.resolve_in(arg.id, owner, init, env) if isinstance(arg, ast.Name) else None

        for node in ast.walk(init):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
                    and isinstance(node.func.value, ast.Call) and getattr(node.func.value.func, "id", "") == "super"):
                return [bound(a) for a in node.args], {k.arg: bound(k.value) for k in node.keywords if k.arg}
        return [], {}

    def attribute_class(self, key, attr: str):
        """The class `__init__` builds into `self.<attr>`: `self.model = LlamaModel(...)`, through a parameter
        (`self.model = language_model_cls(...)`), or through a helper method that returns one
        (`self.model = self._init_model(...)`), searched along the MRO's `__init__`s."""
        for owner, init, env in self.init_chain(key):
            for node in ast.walk(init):
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                        and any(isinstance(t, ast.Attribute) and t.attr == attr and getattr(t.value, "id", "") == "self"
                                for t in node.targets)):
                    found = self._built_class(key, owner, init, env, node.value)
                    if found:
                        return found
        return None

    def _built_class(self, key, owner, init, env, call: ast.Call):
        if isinstance(call.func, ast.Name):
            return self.resolve_in(call.func.id, owner, init, env)
        if isinstance(call.func, ast.Attribute) and getattr(call.func.value, "id", "") == "self":
            held = self.class_attribute(key, call.func.attr)  # `self.model = self.body_cls(...)`
            if held:
                return held
            helper_owner, helper = self.method(key, call.func.attr)
            for node in ast.walk(helper) if helper else ():
                if isinstance(node, ast.Return) and isinstance(node.value, ast.Call) and isinstance(node.value.func,
                                                                                                  ast.Name):
                    return self.resolve_in(node.value.func.id, helper_owner, helper)
        return None

    def class_attribute(self, key, name: str):
        """The class a class attribute holds (`body_cls = qwen3_5.Qwen3_5ForCausalLM`), the most derived first."""
        for owner in self.mro(key):
            for node in self.classes[owner].body:
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                    value = node.value
                    if isinstance(value, ast.Name):
                        return self.resolve(value.id, owner[0])
                    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
                        module = self.modules[owner[0]].get(value.value.id)
                        return self.resolve(value.attr, module) if module else None
                    return None
        return None

    def call(self, owner, func: ast.FunctionDef, ids, L: int, absent: frozenset = frozenset()) -> list:
        """Executes SGLang's method as written, on a Recorder; returns what it recorded."""
        module = ast.Module(body=[func], type_ignores=[])
        namespace = ModuleNames({name: getattr(typing, name) for name in typing.__all__})
        exec(compile(module, f"sglang/srt/models/{owner[0]}", "exec"), namespace)  # noqa: S102 - SGLang's own code
        log: list = []
        namespace[func.name](Recorder("self", log, L, absent), None if ids is None else list(ids))
        return log


def _model_imports(node: ast.ImportFrom) -> dict[str, str]:
    if not (node.module or "").startswith("sglang.srt.models."):
        return {}
    return {alias.asname or alias.name: node.module.rsplit(".", 1)[1] + ".py" for alias in node.names}


def _stored(log: list, path: str):
    return next((value for kind, where, value in reversed(log) if kind == "set" and where == path), None)


def _called(log: list, path: str):
    return next((args for kind, where, args in reversed(log) if kind == "call" and where == path), None)


def capture_indices(files: ModelFiles, key, ids, L: int, depth: int = 0):
    """(indices stored into layers_to_capture, the class whose forward reads them, the wrapped class or None,
    whether the layers were marked too) for `ids` on an L-layer target; NoCapture when the method stores none."""
    owner, func = files.method(key, METHOD)
    if func is None or depth > 3:
        raise NoCapture("stores no layers_to_capture")
    inner = {attr: files.attribute_class(key, attr) for attr in ("model", "language_model")}
    absent = frozenset(f"self.{attr}.{METHOD}" for attr, cls in inner.items()
                       if cls and not files.method(cls, METHOD)[1])
    try:
        log = files.call(owner, func, ids, L, absent)
    except AttributeError as err:  # it calls the method on an inner class that lacks it, as SGLang would fail
        if err.name != METHOD or not isinstance(err.obj, Recorder):
            raise
        raise NoCapture(f"passes the capture to a {err.obj._path.removeprefix('self.')} that does not capture") from err
    marked = any(kind == "set" and where.endswith(f".{MARK}") for kind, where, _ in log)
    for attr, stored in (("model", _stored(log, "self.model.layers_to_capture")),
                         ("language_model", _stored(log, "self.language_model.layers_to_capture")),
                         ("self", _stored(log, "self.layers_to_capture"))):
        if stored is None:
            continue
        holder = key if attr == "self" else inner[attr] or (key if attr == "model" else None)
        if holder is None:
            raise NoCapture(f"stores into a {attr} whose class the reader cannot find")
        return list(stored), holder, holder[1] if attr == "language_model" else None, marked
    for attr in ("model", "language_model"):
        args = _called(log, f"self.{attr}.{METHOD}")
        if args is None:
            continue
        if inner[attr] is None or not files.method(inner[attr], METHOD)[1]:
            raise NoCapture(f"passes the capture to a {attr} that does not capture")
        got, holder, wraps, marked = capture_indices(files, inner[attr], args[0], L, depth + 1)
        return got, holder, inner[attr][1] if attr == "language_model" else wraps, marked
    raise NoCapture("stores no layers_to_capture")


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
    except NoCapture as why:
        return {**entry, "captures": None, "why": f"{METHOD} {why}"}
    except Exception as err:  # noqa: BLE001 - a method this reader cannot run is recorded, and refused later
        return {**entry, "captures": None, "why": f"{METHOD} could not be read: {type(err).__name__}: {err}"}
    rule = derive_rule([(L, ids, got) for L, ids, (got, _, _, _) in table])
    default = derive_default(defaults)
    where = {(holder, wraps) for _, _, (_, holder, wraps, _) in table}
    if rule is None or default is None or len(where) != 1:
        return {**entry, "captures": None, "why": f"{METHOD} follows no known id rule"}
    (holder, wraps), = where
    source = forward_source(files, holder)
    if not READS_LIST.search(source):
        if MARK not in source:
            return {**entry, "captures": False, "why": f"{holder[1]}'s forward never reads layers_to_capture"}
        if not all(marked for _, _, (_, _, _, marked) in table):
            return {**entry, "captures": False, "why": f"{holder[1]}'s forward reads only the layers' {MARK} "
                    f"marks, which {METHOD} never sets"}
    before_add = pre_residual(files, holder)
    if before_add:
        return {**entry, "captures": False, "why": (
            f"{holder[1]} captures `{before_add}` as its layers return it beside a separate residual, a layer's "
            "output before the residual add, not the residual stream extraction stores")}
    entry.update(captures=True, ids=rule, default=default, last_layer=bool(FINAL_CAPTURE.search(source)))
    if wraps:
        entry["wraps"] = wraps
    return entry


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
        "without_method": method_check(Path(models_dir).parent) if Path(models_dir).parent.name == "srt" else None,
        "architectures": dict(sorted(archs.items())),
    }


def main(argv: list[str]) -> int:
    import json
    import sys

    from draftlab.util.cli_parser import ArgumentParser
    from draftlab.sglang.capture import contract_path, shipped_versions
    from draftlab.sglang.contract import cli_python, sglang_sources

    parser = ArgumentParser(prog="python -m draftlab capture-contract",
                            description="Regenerate SGLang's EAGLE-3 capture contracts from each version's model "
                                        "files.")
    parser.add_argument("--write", action="store_true", help="write capture_<version>.json (default: compare only)")
    parser.add_argument("--version", action="append", help="only this SGLang version (repeatable; default: every "
                        "shipped one, and with --write also every version whose source is found)")
    parser.add_argument("--python", help="the sglang venv's interpreter (default: scripts/setup-sglang.sh's)")
    args = parser.parse_args(argv)
    python = cli_python("capture-contract", args.python)
    if python is None:
        return 2
    sources = sglang_sources(python)
    versions = args.version or sorted(set(shipped_versions()) | (set(sources) if args.write else set()))
    missing = [v for v in versions if v not in sources]
    if missing:
        print(f"capture-contract: no source for SGLang {', '.join(missing)} (found {', '.join(sorted(sources))}): "
              f"run scripts/sglang-source.sh {python.parent.parent} VERSION", file=sys.stderr)
        return 2
    differ = 0
    for version in versions:
        text = json.dumps(read_contract(sources[version][0] / "srt" / "models", version), indent=1) + "\n"
        path = contract_path(version)
        if args.write:
            path.write_text(text)
            print(f"wrote {path}")
            continue
        same = path.exists() and path.read_text() == text
        differ += not same
        print(f"{path.name}: {'same as' if same else 'DIFFERS from'} SGLang {version}'s model files")
    return 1 if differ else 0

"""Reads, from SGLang's own source, every draft config key its EAGLE-3 draft class and worker read, and which
weight files its loader takes from a draft folder.

check-draft must check every key SGLang acts on: a key it never reads (say `eagle_config.use_aux_hidden_state:
false`, which makes SGLang feed the draft the last hidden state and skip `fc`) passes as OK and serves at accept
~1. So the list is generated, not written: the draft class (`LlamaForCausalLMEagle3`) is followed through its
bases and the classes its constructors build (resolved by `capture_reader.ModelFiles`), and every read of its
config (`config.k`, `getattr(config, "k")`, `hasattr`, `eagle_config.get("k")`, `d["k"]`, `"k" in d`) in the
methods SGLang calls is recorded, as are the draft config reads of the worker functions that size and feed the
draft. The loader's weight-file patterns come from `DefaultModelLoader._prepare_weights`. Parsed, not imported:
no GPU build needed. `python -m draftlab draft-contract --write` regenerates the file (`pytest -m sglang` compares).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from draftlab.sglang.capture_reader import ModelFiles
from draftlab.sglang.draft_config import CONTRACT
DRAFT_CLASS = ("llama_eagle3.py", "LlamaForCausalLMEagle3")
# the draft methods SGLang calls: construction, forward, loading, and the worker's embedding/head sharing
DRAFT_METHODS = ("__init__", "forward", "load_weights", "set_embed", "set_embed_and_head", "get_hot_token_id")
# worker functions (path under srt/, name) that read the draft's hf_config
WORKER_FUNCTIONS = (("speculative/eagle_utils.py", "get_draft_input_from_target_hidden_dim"),
                    ("model_executor/model_runner_components/spec_aux_hidden_state.py",
                     "_resolve_eagle_aux_hidden_state"))
LOADER = ("model_loader/loader.py", "DefaultModelLoader", "_prepare_weights")
DRAFT_CONFIG_NAMES = {"config", "config_"}  # in the draft classes: the hf config and its deepcopy


class ConfigReads(ast.NodeVisitor):
    """The config keys one function reads; `is_config(node)` says which expressions hold the config."""

    def __init__(self, is_config):
        self.is_config = is_config
        self.keys: set[str] = set()
        self.dicts: dict[str, set[str]] = {}  # local name -> the config keys whose (dict) value it holds
        self.getters: dict[str, set[str]] = {}  # local name -> keys whose .get it is (`get_eagle_config`)

    def read(self, func: ast.AST) -> set[str]:
        for node in ast.walk(func):  # locals first, so that reads through them are known wherever they occur
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self._local(node.targets[0].id, node.value)
        self.visit(func)
        return self.keys

    def _local(self, name: str, value: ast.AST) -> None:
        value = _first(value)
        if isinstance(value, ast.Attribute) and value.attr == "get" and self._dict_keys(value.value):
            self.getters.setdefault(name, set()).update(self._dict_keys(value.value))
        elif self._dict_keys(value):
            self.dicts.setdefault(name, set()).update(self._dict_keys(value))

    def _dict_keys(self, node: ast.AST) -> set[str]:
        """The config keys whose value `node` is: `config.k`, `getattr(config, "k", ...)`, a local holding one."""
        key = self._config_key(node)
        if key:
            return {key}
        return set(self.dicts.get(node.id, ())) if isinstance(node, ast.Name) else set()

    def _config_key(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and self.is_config(node.value):
            return node.attr
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2 and self.is_config(node.args[0]) and _text(node.args[1])):
            return _text(node.args[1])
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self._config_key(node):
            self.keys.add(node.attr)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        key = self._config_key(node)
        if key:
            self.keys.add(key)
        sub = _text(node.args[0]) if node.args else None
        if sub and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            self.keys.update(f"{k}.{sub}" for k in self._dict_keys(node.func.value))
        if sub and isinstance(node.func, ast.Name):
            self.keys.update(f"{k}.{sub}" for k in self.getters.get(node.func.id, ()))
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load) and _text(node.slice):
            self.keys.update(f"{k}.{_text(node.slice)}" for k in self._dict_keys(node.value))
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if _text(node.left) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            self.keys.update(f"{k}.{_text(node.left)}" for k in self._dict_keys(node.comparators[0]))
        self.generic_visit(node)


def _first(node: ast.AST) -> ast.AST:
    """`a or {}` -> a; `x.get if ... else ...` -> x.get: the branch that carries the value."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return _first(node.values[0])
    if isinstance(node, ast.IfExp):
        return _first(node.body)
    return node


def _text(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_draft_config(node: ast.AST) -> bool:
    """`config`, `config_` (its deepcopy), `self.config`, `self.model.config`."""
    if isinstance(node, ast.Name):
        return node.id in DRAFT_CONFIG_NAMES
    return isinstance(node, ast.Attribute) and node.attr == "config" and (
        getattr(node.value, "id", None) == "self" or getattr(getattr(node.value, "value", None), "id", None) == "self")


def _is_hf_config(node: ast.AST) -> bool:
    """In the worker: `hf_config` or `<model config>.hf_config`, the draft's hf config."""
    return getattr(node, "id", None) == "hf_config" or getattr(node, "attr", None) == "hf_config"


def _calls_super(func: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == func.name
               and isinstance(n.func.value, ast.Call) and getattr(n.func.value.func, "id", "") == "super"
               for n in ast.walk(func))


def _mro(files: ModelFiles, key) -> list[tuple[str, str]]:
    """ModelFiles.mro, except that a class named like the base it imports (llama_eagle3's LlamaDecoderLayer
    over llama's) reaches that base instead of itself."""
    order, stack = [], [key]
    while stack:
        current = stack.pop(0)
        if current is None or current in order or current not in files.classes:
            continue
        order.append(current)
        for base in files.classes[current].bases:
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
            found = files.resolve(name, current[0]) if name else None
            if found == current:
                origin = files.imports.get(current[0], {}).get(name)
                found = files.resolve(name, origin) if origin else None
            stack.append(found)
    return order


def draft_reads(files: ModelFiles) -> dict[str, set[str]]:
    """key -> {"file:Class.method"} over the draft class and every model class its constructors build."""
    reads: dict[str, set[str]] = {}
    todo, seen = [DRAFT_CLASS], set()
    while todo:
        key = todo.pop()
        if key in seen or key not in files.classes:
            continue
        seen.add(key)
        mro = _mro(files, key)
        for name in DRAFT_METHODS if key == DRAFT_CLASS else ("__init__", "forward"):
            for owner in mro:  # the definer SGLang runs, and the bases it reaches through super()
                func = next((n for n in files.classes[owner].body
                             if isinstance(n, ast.FunctionDef) and n.name == name), None)
                if func is None:
                    continue
                for read in ConfigReads(_is_draft_config).read(func):
                    reads.setdefault(read, set()).add(f"{owner[0]}:{owner[1]}.{name}")
                if name == "__init__":
                    todo += [files.resolve(n.func.id, owner[0]) for n in ast.walk(func)
                             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
                if not _calls_super(func):
                    break
    return reads


def worker_reads(srt: Path) -> dict[str, set[str]]:
    reads: dict[str, set[str]] = {}
    for path, name in WORKER_FUNCTIONS:
        tree = ast.parse((srt / path).read_text(encoding="utf-8"))
        func = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
        for read in ConfigReads(_is_hf_config).read(func):
            reads.setdefault(read, set()).add(f"{path.rsplit('/', 1)[-1]}:{name}")
    return reads


def weight_files(srt: Path) -> dict:
    """The default (`auto`) load format's file patterns, in the order tried (the first that matches wins), and
    the index that, when present, limits the safetensors files to those it lists."""
    path, cls, name = LOADER
    tree = ast.parse((srt / path).read_text(encoding="utf-8"))
    owner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    func = next(n for n in owner.body if isinstance(n, ast.FunctionDef) and n.name == name)
    patterns, index = None, None
    for node in ast.walk(func):
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and getattr(node.test.comparators[0], "attr", None) == "AUTO"):
            assign = next(n for n in node.body if isinstance(n, ast.Assign))
            patterns = [_text(e) for e in assign.value.elts]
        if (isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "index_file"
                and index is None):
            index = _text(node.value) or _constant(srt, node.value.id)
    if not patterns or not index:
        raise ValueError(f"{path}: {cls}.{name} no longer has the auto load format's patterns and index file")
    return {"patterns": patterns, "first_match_wins": True, "index": index}


def _constant(srt: Path, name: str) -> str:
    """A string constant sglang imports from transformers (SAFE_WEIGHTS_INDEX_NAME), read from its source."""
    for path in sorted((srt.parents[1] / "transformers" / "utils").glob("*.py")):
        found = re.search(rf"^{name}\s*=\s*['\"]([^'\"]+)['\"]", path.read_text(encoding="utf-8"), re.M)
        if found:
            return found.group(1)
    raise ValueError(f"{name}: not found in the installed transformers' utils")


def read_draft_contract(srt: Path, version: str) -> dict:
    """`srt` is the installed package's `sglang/srt` folder."""
    srt = Path(srt)
    reads = draft_reads(ModelFiles(srt / "models"))
    for key, where in worker_reads(srt).items():
        reads.setdefault(key, set()).update(where)
    return {
        "sglang_version": version,
        "regenerate": "python -m draftlab draft-contract --write",
        "draft_class": DRAFT_CLASS[1],
        "keys": {key: sorted(where) for key, where in sorted(reads.items())},
        "weight_files": weight_files(srt),
    }


def main(argv: list[str]) -> int:
    import json

    from draftlab.util.cli_parser import ArgumentParser
    from draftlab.sglang.contract import cli_python, installed_sglang

    parser = ArgumentParser(prog="python -m draftlab draft-contract",
                            description="Regenerate the draft config keys and weight files SGLang reads.")
    parser.add_argument("--write", action="store_true", help=f"write {CONTRACT.name} (default: compare only)")
    parser.add_argument("--python", help="the sglang venv's interpreter (default: scripts/setup-sglang.sh's)")
    args = parser.parse_args(argv)
    python = cli_python("draft-contract", args.python)
    if python is None:
        return 2
    package, version = installed_sglang(python)
    text = json.dumps(read_draft_contract(package / "srt", version), indent=1) + "\n"
    if args.write:
        CONTRACT.write_text(text)
        print(f"wrote {CONTRACT}")
        return 0
    same = CONTRACT.exists() and CONTRACT.read_text() == text
    print(f"{CONTRACT.name}: {'same as' if same else 'DIFFERS from'} the installed sglang's draft loader")
    return 0 if same else 1

"""What SGLang's source does with a capture besides the capture method: whether a class's forward reads it, whether
what it appends is the residual stream, and what the server does with a class that has no capture method.

capture_reader.py runs each class's `set_eagle3_layers_to_capture`; these read the code around it, by parsing
(never importing) the package source, so that the contract can refuse what the method alone does not show.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

METHOD = "set_eagle3_layers_to_capture"
READS_LIST = re.compile(r"in\s+self\.layers_to_capture\b")
# Qwen3.5's forward reads marks its setter puts on each captured layer, not the list: without the marks (SGLang
# 0.5.17's Qwen3.5 has no EAGLE-3 setter, and Qwen3-VL's then stores the bare list) it captures nothing
MARK = "_is_layer_to_capture"
FINAL_CAPTURE = re.compile(r"\b(self\.end_layer|len\(self\.layers\)|self\.config\.num_hidden_layers|num_layers)\s+in\s+"
                           r"self\.layers_to_capture")


def forward_source(files, holder) -> str:
    """The source of `holder` and its bases minus the capture setters: what runs when the model does (a setter
    that marks layers says nothing about whether forward reads the marks)."""
    parts = []
    for key in files.mro(holder):
        for node in files.classes[key].body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("set_") and "capture" in node.name):
                parts.append(ast.get_source_segment(files.sources[key[0]], node) or "")
    return "\n".join(parts)


def _reads_capture_list(test: ast.expr) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "layers_to_capture" for n in ast.walk(test))


def pre_residual(files, holder) -> str | None:
    """The name a forward of `holder` captures when it is not the residual stream: the loop unpacks
    `hidden_states, residual = layer(...)` and the capture appends `hidden_states` alone. Gemma-3 does this: its
    layers return the MLP branch (after post_feedforward_layernorm) and the residual apart, and add them in the
    next layer's norm, so what it captures at c >= 1 is layer c-1's branch before the residual add."""
    for key in files.mro(holder):
        for func in files.classes[key].body:
            if not isinstance(func, ast.FunctionDef):
                continue
            split = {t.id for node in ast.walk(func) if isinstance(node, ast.Assign)
                     for target in node.targets if isinstance(target, ast.Tuple)
                     and any(getattr(e, "id", None) == "residual" for e in target.elts)
                     for t in target.elts if isinstance(t, ast.Name) and t.id != "residual"}
            for node in ast.walk(func):
                if not (isinstance(node, ast.If) and _reads_capture_list(node.test)):
                    continue
                for call in (n for stmt in node.body for n in ast.walk(stmt)):
                    if (isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "append" and call.args
                            and isinstance(call.args[0], ast.Name) and call.args[0].id in split):
                        return call.args[0].id
    return None


def method_check(srt: Path) -> dict | None:
    """Where SGLang's model runner calls the target's capture method, and the error a class without it meets
    there: the check's own exception where the function asks `hasattr` first, else Python's AttributeError."""
    models = srt / "models"
    for path in sorted(srt.rglob("*.py")):
        if models in path.parents:
            continue
        text = path.read_text(encoding="utf-8")
        if f".{METHOD}(" not in text:
            continue
        for func in ast.walk(ast.parse(text)):
            if not isinstance(func, ast.FunctionDef) or not any(
                    isinstance(n, ast.Call) and getattr(n.func, "attr", None) == METHOD for n in ast.walk(func)):
                continue
            checked = any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "hasattr"
                          and any(isinstance(a, ast.Constant) and a.value == METHOD for a in n.args)
                          for n in ast.walk(func))
            raised = next((n.exc.func.id for n in ast.walk(func) if isinstance(n, ast.Raise)
                           and isinstance(n.exc, ast.Call) and isinstance(n.exc.func, ast.Name)), None)
            return {"where": f"{path.relative_to(srt.parent).as_posix()}:{func.name}",
                    "error": raised if checked and raised else "AttributeError", "checked": checked}
    return None

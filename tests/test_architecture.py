"""The house's layers (docs/ARCHITECTURE.md): a module imports only from its own layer or the layers below it,
so nothing under the stages reaches up into them, and the module graph has no circle."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "draftlab"
# Bottom to top; each entry is a top-level module or subpackage of draftlab.
LAYERS = [
    {"config", "config_schema", "fsutil", "progress", "attention", "provenance", "code_version", "target_shape",
     "reporting", "cli_parser"},
    {"model", "target", "data", "sglang", "serve", "generation", "train", "export", "draft_provenance",
     "plan_estimates"},
    {"tracking", "analysis", "plan", "preflight", "root_check", "stage_keys"},
    {"stages"},
    {"pipeline", "task", "dvc_stage", "warmup", "import_runs", "benchmarks", "offline", "__main__", "__init__"},
]
LAYER = {name: level for level, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)] = path
    return found


def imported(path: Path, module: str, known: dict) -> set[str]:
    """draftlab modules `path` imports, at module level or inside a function."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("draftlab"))
        elif isinstance(node, ast.ImportFrom):
            parent = node.module or ""
            if node.level:
                parent = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [parent]).strip(".")
            if parent.startswith("draftlab"):
                out.update(f"{parent}.{a.name}" if f"{parent}.{a.name}" in known else parent for a in node.names)
    return {name for name in out if name in known and name != module}


def group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def graph() -> dict[str, set[str]]:
    known = modules()
    return {module: imported(path, module, known) for module, path in known.items()}


def test_every_module_has_a_layer():
    missing = sorted({group(m) for m in modules()} - set(LAYER))
    assert not missing, f"give these a layer in LAYERS (and docs/ARCHITECTURE.md): {missing}"


def upward(edges: dict[str, set[str]]) -> list[str]:
    return [f"{m} (layer {LAYER[group(m)]}) imports {d} (layer {LAYER[group(d)]})"
            for m, deps in sorted(edges.items()) for d in sorted(deps) if LAYER[group(d)] > LAYER[group(m)]]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    state, found = {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def test_no_module_imports_from_a_layer_above_it():
    assert not upward(graph()), "\n".join(upward(graph()))


def test_the_module_graph_has_no_circle():
    assert not circles(graph()), "\n".join(" -> ".join(c) for c in circles(graph()))


def test_the_checks_see_an_upward_import(tmp_path, monkeypatch):
    """The checks can fail: a data module that imports a stage, which imports it back, is caught twice."""
    (tmp_path / "draftlab" / "data").mkdir(parents=True)
    (tmp_path / "draftlab" / "stages").mkdir()
    (tmp_path / "draftlab" / "data" / "bad.py").write_text("from draftlab.stages import train\n")
    (tmp_path / "draftlab" / "stages" / "train.py").write_text("from draftlab.data import bad\n")
    for init in ("", "data", "stages"):
        (tmp_path / "draftlab" / init / "__init__.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "draftlab")
    edges = graph()
    assert upward(edges) == ["draftlab.data.bad (layer 1) imports draftlab.stages.train (layer 3)"]
    assert circles(edges) == [["draftlab.data.bad", "draftlab.stages.train", "draftlab.data.bad"]]

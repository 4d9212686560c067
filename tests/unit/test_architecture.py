"""The house's layers (docs/ARCHITECTURE.md): each folder of src/draftlab/ imports only from its own layer or the
layers below it, no two folders import each other (at module level or inside a function), and the package root
holds only the entry points, so the folders stack and the module graph has no circle."""

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "draftlab"
ROOT = "(root)"  # the entry points beside the folders: src/draftlab/*.py
MAX_ROOT_FILES = 5
# Bottom to top; each entry is a folder of src/draftlab/, or ROOT.
LAYERS = [
    {"util", "config", "stats", "provenance"},
    {"target", "model", "sglang", "serve", "data", "generation", "train"},
    {"plan", "checks", "analysis", "tracking"},
    {"stages"},
    {"warmup", "benchmarks", "offline", ROOT},
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


def folder(path: Path) -> str:
    """The top-level folder of src/draftlab/ that holds `path`, or ROOT for a file beside the folders."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else ROOT


def graph() -> dict[str, set[str]]:
    known = modules()
    return {module: imported(path, module, known) for module, path in known.items()}


def folder_edges(edges: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(importing folder, imported folder) -> the module imports behind it, for every import across folders."""
    where = {module: folder(path) for module, path in modules().items()}
    out = defaultdict(list)
    for module, deps in sorted(edges.items()):
        for dep in sorted(deps):
            if where[module] != where[dep]:
                out[where[module], where[dep]].append(f"{module} imports {dep}")
    return out


def upward(edges: dict[str, set[str]]) -> list[str]:
    return [f"{a} (layer {LAYER[a]}) -> {b} (layer {LAYER[b]}): {', '.join(why)}"
            for (a, b), why in folder_edges(edges).items() if LAYER[b] > LAYER[a]]


def two_way(edges: dict[str, set[str]]) -> list[str]:
    ties = folder_edges(edges)
    return [f"{a} <-> {b}: {', '.join(why + ties[b, a])}" for (a, b), why in ties.items() if a < b and (b, a) in ties]


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


def folder_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out = {folder(path): set() for path in modules().values()}
    for a, b in folder_edges(edges):
        out[a].add(b)
    return out


def test_every_folder_has_a_layer():
    missing = sorted({folder(path) for path in modules().values()} - set(LAYER))
    assert not missing, f"give these folders a layer in LAYERS (and docs/ARCHITECTURE.md): {missing}"


def test_the_root_holds_only_entry_points():
    files = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(files) <= MAX_ROOT_FILES, f"src/draftlab/ holds {files}: give all but the entry points a folder"


def test_no_folder_imports_from_a_layer_above_it():
    assert not upward(graph()), "\n".join(upward(graph()))


def test_no_two_folders_import_each_other():
    assert not two_way(graph()), "\n".join(two_way(graph()))


def test_the_folder_graph_has_no_circle():
    found = circles(folder_graph(graph()))
    assert not found, "\n".join(" -> ".join(c) for c in found)


def test_the_module_graph_has_no_circle():
    assert not circles(graph()), "\n".join(" -> ".join(c) for c in circles(graph()))


def test_the_checks_see_an_upward_import_and_a_two_way_tie(tmp_path, monkeypatch):
    """The checks can fail: a data module that imports a stage, and sglang and serve importing each other (one way
    inside a function), are each caught."""
    files = {"data/bad.py": "from draftlab.stages import train\n", "stages/train.py": "",
             "sglang/bench.py": "def f():\n    from draftlab.serve.engine import run\n",
             "serve/engine.py": "run = None\n", "serve/remote.py": "from draftlab.sglang import bench\n"}
    for name in ("__init__.py", "data/__init__.py", "stages/__init__.py", "sglang/__init__.py", "serve/__init__.py",
                 *files):
        (tmp_path / "draftlab" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "draftlab" / name).write_text(files.get(name, ""))
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "draftlab")
    edges = graph()
    assert upward(edges) == ["data (layer 1) -> stages (layer 3): draftlab.data.bad imports draftlab.stages.train"]
    assert two_way(edges) == ["serve <-> sglang: draftlab.serve.remote imports draftlab.sglang.bench, "
                              "draftlab.sglang.bench imports draftlab.serve.engine"]
    assert ["serve", "sglang", "serve"] in circles(folder_graph(edges))

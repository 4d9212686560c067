"""Only draftlab/tracking/runs.py talks to MLflow: every other module goes through its functions."""

import ast

from conftest import REPO


def _imports_mlflow(file) -> bool:
    for node in ast.walk(ast.parse(file.read_text(), filename=str(file))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "mlflow" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mlflow" and not node.level:
            return True
    return False


def test_only_tracking_imports_mlflow():
    sources = sorted((REPO / "src").rglob("*.py"))
    assert len(sources) > 20  # the tree was found
    offenders = [str(f.relative_to(REPO)) for f in sources if _imports_mlflow(f)]
    assert offenders == ["src/draftlab/tracking/runs.py"], offenders


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    file = tmp_path / "m.py"
    file.write_text("def f():\n    from mlflow.entities import Metric\n")
    assert _imports_mlflow(file)


def test_child_search_pages_through_every_child(tmp_path):
    from draftlab.tracking.run_queries import child_runs, search_runs
    from draftlab.tracking.runs import create_run, open_client

    client = open_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = create_run(client, "paging", "parent", {})
    children = {create_run(client, "paging", f"c{i}", {"mlflow.parentRunId": parent}) for i in range(5)}
    experiment = client.get_run(parent).info.experiment_id
    paged = search_runs(client, [experiment], f"tags.`mlflow.parentRunId` = '{parent}'", page_size=2)
    assert {r.info.run_id for r in paged} == children  # three pages of 2, 2 and 1
    assert {r.info.run_id for r in child_runs(client, parent)} == children

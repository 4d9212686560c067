"""Reading runs back through an MlflowClient (the analysis, sweeps, benchmarks): experiments by name, every page of
a search, a parent's children, a metric's history. No mlflow import: runs.py stays the one module that has it
(tests/integration/test_tracking_boundary.py)."""

from __future__ import annotations


def find_experiment_id(client, name: str) -> str | None:
    experiment = client.get_experiment_by_name(name)
    return None if experiment is None else experiment.experiment_id


def search_runs(client, experiment_ids: list[str], filter_string: str = "", order_by: list[str] | None = None,
                page_size: int = 1000) -> list:
    """Every matching run, page by page (a sweep may have more children than one page holds)."""
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string=filter_string, max_results=page_size,
                                  order_by=order_by, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def child_runs(client, parent_run_id: str) -> list:
    """The runs tagged as children of `parent_run_id`, in its experiment."""
    parent = client.get_run(parent_run_id)
    return search_runs(client, [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_run_id}'")


def metric_history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]

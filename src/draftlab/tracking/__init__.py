"""MLflow tracking: runs and their store (runs.py, store.py), where a job's runs live (run_context.py), their names,
a sweep's parent run (sweep.py) and the table a job ends with (summary.py). Stages never import this package: they
report through draftlab.reporting."""

"""MLflow tracking: runs and their store (runs.py, store.py), where a job's runs live (run_context.py), their names,
a sweep's parent run (sweep.py), the table a job ends with (summary.py), a sweep's analysis read from and logged back
to MLflow (analyze.py, mlflow_source.py) and jobs run without a store brought in (import_runs.py). Stages never
import this package: they report through draftlab.util.reporting."""

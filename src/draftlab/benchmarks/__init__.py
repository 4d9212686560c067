"""Named benchmarks: `python -m draftlab benchmark NAME [overrides]`, declared in conf/benchmark/.

declarations: the config group (list, compose, the command a declaration runs);
measure: run the commands and read their numbers;
record: the machine, results.json, the MLflow `benchmarks` experiment and the printed table;
cli: the command line.
"""

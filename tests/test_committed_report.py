"""docs/data_scaling.md is what the analysis makes of the committed records: an analysis change that moves
its numbers or words fails here until the report is generated again (README: "docs/data_scaling.md from ...")."""

from pathlib import Path

from draftlab.analysis.cli import main

REPO = Path(__file__).resolve().parents[1]
RECORDS = "bench/results/data_scaling/records.jsonl.gz"  # as the report's first line names it


def test_the_committed_report_is_the_records_analysed_by_this_code(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    fresh = tmp_path / "data_scaling.md"
    assert main(["data_scaling", "--records", RECORDS, "--report", str(fresh)]) == 0
    ours = fresh.read_text().replace(str(fresh), "docs/data_scaling.md")
    assert ours == (REPO / "docs" / "data_scaling.md").read_text()

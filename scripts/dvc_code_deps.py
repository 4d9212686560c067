"""Rewrites each dvc.yaml stage's `src/` deps from code_version.stage_files, the one list of a stage's code:
`python scripts/dvc_code_deps.py` (tests/integration/test_code_version.py fails when dvc.yaml and the list differ)."""

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from draftlab.provenance.code_version import stage_files  # noqa: E402
from draftlab.config.config import STAGE_NAMES  # noqa: E402


def rewrite(text: str) -> str:
    for name in STAGE_NAMES:
        start = re.search(rf"^  {name}:\n", text, re.M).end()
        block = re.compile(r"(?:^      - src/.*\n)+", re.M).search(text, start)
        deps = "".join(f"      - {p.relative_to(REPO)}\n" for p in sorted(stage_files(name)))
        text = text[:block.start()] + deps + text[block.end():]
    return text


if __name__ == "__main__":
    path = REPO / "dvc.yaml"
    path.write_text(rewrite(path.read_text()))

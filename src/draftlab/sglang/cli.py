"""Entry points for `python -m draftlab check-draft ...` and `python -m draftlab convert ...`.

`__main__.py` (owned by the lead) dispatches the sub-command name here with the remaining argv.
"""

from __future__ import annotations

import sys

from draftlab.sglang.check import check_draft_main
from draftlab.sglang.formats import convert_main

COMMANDS = {"check-draft": check_draft_main, "convert": convert_main}


def main(argv: list[str] | None = None) -> int:
    """argv = [command, *args]; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m draftlab {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())

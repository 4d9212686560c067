"""Writes ShareGPT's prompts as JSONL for a machine that cannot carry the 125 MB JSON (bench/h200_session.sh).

    python bench/export_prompts.py .gpu/sharegpt_prompts.jsonl --count 24000 --max-chars 1000
"""

import argparse
import json
from pathlib import Path

from draftlab.data.prompts import load_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--count", type=int, default=24000)
    ap.add_argument("--max-chars", type=int, default=1000, help="drop longer prompts (most exceed the token cap)")
    args = ap.parse_args()
    prompts = [p for p in load_prompts("sharegpt", None, seed=0).prompts if len(p.text) < args.max_chars]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as handle:
        for prompt in prompts[: args.count]:
            handle.write(json.dumps({"prompt": prompt.text, "id": prompt.conversation_id}) + "\n")


if __name__ == "__main__":
    main()

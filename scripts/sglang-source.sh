#!/usr/bin/env bash
# Unpacks an older SGLang release as SOURCE beside the sglang venv, for the per-version contract tests
# (pytest -m sglang): capture-contract reads its model files, and the launch test runs its argument parser
# with the venv's packages and PYTHONPATH=<venv>/sglang-<version>. Nothing is installed into the venv.
#
# Usage: scripts/sglang-source.sh VENV_DIR VERSION      (scripts/setup-sglang.sh calls it for 0.5.17)
set -euo pipefail

VENV="$1"
VERSION="$2"
DEST="$VENV/sglang-$VERSION"
if [ -f "$DEST/sglang/version.py" ]; then
  echo "sglang $VERSION source already in $DEST"
  exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP" "$DEST.partial"' EXIT
# The wheel holds only Python and kernel sources: whatever its tag, it unpacks as the package's source.
GET=("$VENV/bin/python" -m pip download --quiet --no-input --no-deps --dest "$TMP")
"${GET[@]}" "sglang==$VERSION"
mkdir -p "$DEST.partial"
if [ "$VERSION" = "0.5.17" ]; then
  # 0.5.17 registers transformers configs (qwen3_asr) that the venv's transformers 5.19 already has, and
  # fails at import; its own pins go on its PYTHONPATH, ahead of the venv. Its server_args also imports einops.
  "${GET[@]}" transformers==5.12.1 tokenizers==0.22.2 "huggingface_hub>=1.5,<2" einops
  # server_args imports xgrammar (0.5.23 does not) only for pydantic types of tool-call grammars: an inert
  # package whose every name is an open pydantic model stands in for its 44 MB wheel.
  mkdir -p "$DEST.partial/xgrammar"
  cat > "$DEST.partial/xgrammar/__init__.py" <<'STUB'
"""draftlab stub: sglang 0.5.17's server_args imports xgrammar's pydantic types; argument parsing never uses them."""
from pydantic import BaseModel, ConfigDict

__version__ = "0.0.0+draftlab.stub"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (BaseModel,), {"model_config": ConfigDict(extra="allow"), "__module__": __name__})
STUB
  cp "$DEST.partial/xgrammar/__init__.py" "$DEST.partial/xgrammar/structural_tag.py"
fi
for wheel in "$TMP"/*.whl; do
  "$VENV/bin/python" -m zipfile -e "$wheel" "$DEST.partial"
done
mv "$DEST.partial" "$DEST"
echo "sglang $VERSION source in $DEST ($(du -sh "$DEST" | cut -f1))"

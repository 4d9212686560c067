"""draft_config_contract.json: the draft config keys and weight-file patterns SGLang reads (draft_keys_reader.py
generates it). Named after this module so that a stage's code key covers it (provenance/code_version.py)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

CONTRACT = Path(__file__).with_name("draft_config_contract.json")


@cache
def contract() -> dict:
    return json.loads(CONTRACT.read_text())


def weight_files() -> dict:
    """SGLang's weight-file patterns (in the order its loader tries them) and index file name."""
    return contract()["weight_files"]

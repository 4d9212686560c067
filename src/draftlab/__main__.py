"""python -m draftlab COMMAND ...: the commands and what each does are in COMMANDS (no COMMAND lists them)."""

import logging
import sys

from draftlab.config.config import ConfigError

COMMANDS = {
    "stage": ("draftlab.dvc_stage", "run one pipeline stage on params.yaml (what dvc.yaml calls)"),
    "check-draft": ("draftlab.sglang.cli", "check a draft folder against what SGLang loads"),
    "convert": ("draftlab.sglang.cli", "convert a draft folder between SGLang and speculators formats"),
    "capture-contract": ("draftlab.sglang.capture_reader", "regenerate SGLang's EAGLE-3 capture contract"),
    "draft-contract": ("draftlab.sglang.draft_keys_reader", "regenerate the draft config keys and weight files SGLang "
                       "reads"),
    "plan": ("draftlab.plan.plan", "what a run takes (storage, memory, SGLang flags), from config.json alone"),
    "import-runs": ("draftlab.tracking.import_runs", "log jobs run without a tracking store (results.json) into "
                    "MLflow"),
    "warm-compile": ("draftlab.warmup.compile", "build the train stage's compiled graphs ahead"),
    "warm-decode": ("draftlab.warmup.decode", "build the generate stage's compiled decode step ahead"),
    "intervals": ("draftlab.serve.rederive", "re-derive a bench result's 95% intervals from its per_prompt.json"),
    "benchmark": ("draftlab.benchmarks.cli", "run a declared benchmark (conf/benchmark/; --list shows them)"),
    "bundle": ("draftlab.offline.bundle", "write what an offline GPU machine needs into one folder"),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        lines = "\n".join(f"  {name:16s} {help_}" for name, (_, help_) in COMMANDS.items())
        print(f"usage: python -m draftlab COMMAND ...\n\ncommands:\n{lines}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import importlib

    module = importlib.import_module(COMMANDS[argv[0]][0])
    try:
        if COMMANDS[argv[0]][0] != "draftlab.sglang.cli":  # that one dispatches on the command's name itself
            return module.main(argv[1:])
        return module.main(argv)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The commands' argument parser: argparse's, except that a bad argument is refused in one line naming it,
with exit code 2 (argparse prints its whole usage first); --help still shows the usage."""

from __future__ import annotations

import argparse


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (--help shows the usage)\n")

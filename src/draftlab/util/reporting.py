"""How stage code reports metrics and artifacts without knowing about MLflow.

The pipeline hands each stage a Reporter; `draftlab.tracking.runs.MlflowReporter` sends to the active MLflow run,
tests use `RecordingReporter`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

log = logging.getLogger("draftlab")


class Reporter(Protocol):
    def metrics(self, values: dict[str, float], step: int | None = None) -> None: ...

    def artifact(self, path: Path, subdir: str | None = None) -> None: ...

    def tag(self, key: str, value: str) -> None: ...


class NullReporter:
    def metrics(self, values: dict[str, float], step: int | None = None) -> None:
        pass

    def artifact(self, path: Path, subdir: str | None = None) -> None:
        pass

    def tag(self, key: str, value: str) -> None:
        pass


class RecordingReporter:
    """Keeps everything in memory: the test double for a tracked run."""

    def __init__(self) -> None:
        self.history: list[tuple[int | None, dict[str, float]]] = []
        self.artifacts: list[tuple[Path, str | None]] = []
        self.tags: dict[str, str] = {}

    def metrics(self, values: dict[str, float], step: int | None = None) -> None:
        self.history.append((step, dict(values)))

    def artifact(self, path: Path, subdir: str | None = None) -> None:
        self.artifacts.append((Path(path), subdir))

    def tag(self, key: str, value: str) -> None:
        self.tags[key] = value

    def last(self, name: str) -> float:
        """The last value logged under `name`; KeyError if never logged."""
        for _, values in reversed(self.history):
            if name in values:
                return values[name]
        raise KeyError(name)

    def series(self, name: str) -> list[float]:
        return [values[name] for _, values in self.history if name in values]

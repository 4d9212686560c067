"""Sweep analysis: the steps and data axes with the other held, power-law fits against training tokens,
comparisons at equal data, prices, and a verdict (under-trained, data-limited, at a bottleneck: features /
capacity / optimisation, or undetermined). See core.analyze."""

__all__ = ["AnalysisResult", "Thresholds", "analyze"]


def __getattr__(name: str):
    """The package's names on first use: `records` alone (import-runs, the benchmark scripts) then loads no plotting."""
    if name in ("AnalysisResult", "analyze"):
        from draftlab.analysis import core

        return getattr(core, name)
    if name == "Thresholds":
        from draftlab.analysis.verdict import Thresholds

        return Thresholds
    raise AttributeError(f"module 'draftlab.analysis' has no attribute {name!r}")

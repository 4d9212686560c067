"""Sweep analysis: the steps and data axes with the other held, power-law fits against training tokens,
comparisons at equal data, prices, and a verdict (under-trained, data-limited, at a bottleneck: features /
capacity / optimisation, or undetermined). See core.analyze."""

from draftlab.analysis.core import AnalysisResult, analyze
from draftlab.analysis.verdict import Thresholds

__all__ = ["AnalysisResult", "Thresholds", "analyze"]

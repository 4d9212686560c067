"""draftlab: a declarative experiment tracker and reproducible-run manager for EAGLE-3 draft models."""

__version__ = "0.1.0"

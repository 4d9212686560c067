"""Helpers every layer uses: atomic files and locks, progress lines, the Reporter protocol, the CLI parser."""

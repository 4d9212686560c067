"""Checks that refuse bad input before work starts: the preflight and the paths.root check."""

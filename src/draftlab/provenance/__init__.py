"""Where a result came from: the commit, the environment (provenance.py) and the hash of a stage's code."""

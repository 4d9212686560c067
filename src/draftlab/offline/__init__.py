"""What a GPU machine without internet needs, in one folder: `python -m draftlab bundle OUT` (docs/offline.md).

closure: the pinned packages to carry, read from this environment; bundle: the folder (wheels, code, install.sh,
files split into parts).
"""

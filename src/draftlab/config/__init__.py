"""The config: its typed schema (config_schema.py) and the validation of a composed conf/ against it (config.py)."""

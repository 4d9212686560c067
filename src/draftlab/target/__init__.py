"""The target model: loading it and its tokenizer (target.py), its shape from config.json alone (target_shape.py)."""

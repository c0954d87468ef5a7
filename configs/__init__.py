"""ml_collections presets. Each module exposes `get_config(preset=None)`."""

"""ml_collections presets: each module exposes `get_config(preset=None)`, starting from
`base.base_config()`, which `schema.py`'s section dataclasses build; `resolve.py` is the one way
a preset and dotted overrides become a run's config (`show.py`: the table of
`train.py --show_config`)."""

"""Moved to `common.atomic_file` (the bottom layer, which `input_pipeline` may import too);
`training.atomic_file.atomic_write` keeps working."""

from common.atomic_file import atomic_write

__all__ = ['atomic_write']

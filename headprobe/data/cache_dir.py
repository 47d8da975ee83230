"""The folder every on-disk cache of headprobe lives under: prepared datasets (`data/`), features, views, orbits."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`HEADPROBE_CACHE`, else ~/.cache/headprobe (an empty `HEADPROBE_CACHE=` counts as unset, not as the current
    folder); tests/test_cache_integrity.py checks both."""
    return Path(os.environ.get("HEADPROBE_CACHE") or Path.home() / ".cache" / "headprobe").expanduser()

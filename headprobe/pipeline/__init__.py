"""The run: the recipe's stages composed, the run directory and its record, resume.

`run`, `run_sweep` and `Results` live in `compose`; they are imported lazily here so that the light modules of this
package (the run directory, the record) load without torch.
"""

from __future__ import annotations

import importlib

_LAZY = {"run", "run_sweep", "Results", "RunError"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module("headprobe.pipeline.compose"), name)
    raise AttributeError(f"module 'headprobe.pipeline' has no attribute {name!r}")

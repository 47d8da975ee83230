"""headprobe: probe backbones before, inside and after projection heads.

The public API is imported lazily so that ``import headprobe`` and the CLI's
``list``/``validate`` stay fast.
"""

from __future__ import annotations

import importlib
import os

# Same seed, same numbers: MKL's default code path gives float64 matrix products that depend on the operands' memory
# alignment, so a resumed run (seed 0 read back from its store, seed 1 fresh) differed from the uninterrupted one in
# the last bit of the uniformity's bootstrap interval on AVX2 CPUs. MKL_CBWR=AUTO keeps the CPU's fastest path and
# makes it reproducible run to run (4096x768 @ 768x4096 float32: 0.25 s either way; COMPATIBLE: 0.80 s). It takes
# effect when torch's MKL starts, so only where headprobe is imported before torch (the CLI; a user's own MKL_CBWR
# wins).
os.environ.setdefault("MKL_CBWR", "AUTO")
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_LAZY = {
    "load_backbone": "headprobe.backbones:load_backbone",
    "Backbone": "headprobe.backbones:Backbone",
    "Preprocess": "headprobe.backbones:Preprocess",
    "run": "headprobe.pipeline.compose:run",
    "Results": "headprobe.pipeline.compose:Results",
    "load_recipe": "headprobe.recipe:load_recipe",
    "Recipe": "headprobe.recipe:Recipe",
    "RecipeError": "headprobe.recipe:RecipeError",
    "load_data": "headprobe.data:load_data",
    "extract": "headprobe.features.extract:extract",
    "ProjectionHead": "headprobe.train.heads:ProjectionHead",
    "load_heads": "headprobe.record.saved_heads:load_heads",
    "load_heads_by_seed": "headprobe.record.saved_heads:load_heads_by_seed",
    "export_heads": "headprobe.record.saved_heads:export_heads",
}
_PACKAGES = ("recipe", "registry", "parallel", "data", "backbones", "ssl", "features", "probes", "stats", "geometry",
             "train", "record", "report", "pipeline")
# Sub-packages and the public modules reached as attributes (`headprobe.train.objectives.vicreg`): name -> module.
_SUBMODULES = {
    **{name: f"headprobe.{name}" for name in _PACKAGES},
    "objectives": "headprobe.train.objectives",
    "runs": "headprobe.record.directory",
}

if TYPE_CHECKING:  # pragma: no cover
    from headprobe.pipeline.compose import Results, run  # noqa: F401
    from headprobe.record.saved_heads import export_heads, load_heads, load_heads_by_seed  # noqa: F401
    from headprobe.train.heads import ProjectionHead  # noqa: F401

    from .backbones import Backbone, Preprocess, load_backbone  # noqa: F401
    from .recipe import Recipe, RecipeError, load_recipe  # noqa: F401


def __getattr__(name: str):
    if name in _LAZY:
        module, _, attr = _LAZY[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'headprobe' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]

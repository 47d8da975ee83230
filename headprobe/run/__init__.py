"""A run: its folder, its context and its stages.

Importing this package binds the name ``headprobe.run`` to it, over the function ``headprobe.run`` (`pipeline.run`);
so that ``headprobe.run(recipe)`` and ``from headprobe import run`` keep running a recipe, the package is callable
and calls it.
"""

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from ..pipeline import run

        return run(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

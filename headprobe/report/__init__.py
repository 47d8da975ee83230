"""Reports of a run: rich terminal tables (`table`), figures (`plots`), the self-contained `report.html` (`html`)
and the comparison of several runs (`compare`). matplotlib is imported only when a figure is drawn, and these names
only when first used, so that a light module of this package (`warning_lines`, which every command loads) costs
nothing more."""

from __future__ import annotations

import importlib

_LAZY = {"write_compare": "compare", "write_report": "html", "write_plots": "plots"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY)

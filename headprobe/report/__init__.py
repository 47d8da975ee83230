"""Reports of a run: rich terminal tables (`table`), figures (`plots`), the self-contained `report.html` (`html`)
and the comparison of several runs (`compare`). matplotlib is imported only when a figure is drawn."""

from .compare import write_compare
from .html import write_report
from .plots import write_plots

__all__ = ["write_compare", "write_plots", "write_report"]

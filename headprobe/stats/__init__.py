"""Statistics: bootstrap intervals, intervals over retraining, and the answers to the paper's questions."""

# Until issue 29 moves headprobe/stats.py to headprobe/stats/bootstrap.py, this package shadows that module: it
# loads the module's file and exports its names, so `from headprobe.stats import PerUnit` keeps working. The lead's
# one-line __init__.py replaces this file at the merge.
import importlib.util as _util
import sys as _sys
from pathlib import Path as _Path

_spec = _util.spec_from_file_location("headprobe.stats_module", _Path(__file__).parent.parent / "stats.py")
_module = _util.module_from_spec(_spec)
_sys.modules[_spec.name] = _module
_spec.loader.exec_module(_module)
globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})

"""The experiment trackers `report_to:` can name, the module each imports and what to install for it: read by the
recipe checks (a missing package is refused before anything runs) and by `report.trackers`."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

TRACKERS = ("tensorboard", "wandb", "mlflow")
TRACKER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
TRACKER_INSTALL = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # a module in sys.modules without a spec
        return True


def missing_packages(names: list[str]) -> list[str]:
    """`pip install` names of the trackers in `names` whose package cannot be imported."""
    return [TRACKER_INSTALL[name] for name in names if not _importable(TRACKER_MODULES[name])]


def mlflow_store_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """Why MLflow could not open its store, said before the run starts, or None. Without ``MLFLOW_TRACKING_URI``
    MLflow 3 stores runs in ``sqlite:///mlflow.db``, which needs SQLAlchemy: `mlflow-skinny` alone then fails only
    when the run ends, with a database error that does not name the fix."""
    environ = os.environ if environ is None else environ
    if environ.get("MLFLOW_TRACKING_URI", "").strip() or _importable("sqlalchemy"):
        return None
    return ("report_to names mlflow, but MLFLOW_TRACKING_URI is not set and MLflow 3's default store "
            "(sqlite:///mlflow.db) needs SQLAlchemy, which is not installed (mlflow-skinny leaves it out): set "
            "MLFLOW_TRACKING_URI to your tracking server (http://...) or to a local folder (file:./mlruns, with "
            "MLFLOW_ALLOW_FILE_STORE=true), or `pip install mlflow`.")

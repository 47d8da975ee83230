"""The experiment trackers `report_to:` can name, the module each imports and what to install for it: read by the
recipe checks (a missing package is refused before anything runs) and by `report.trackers`."""

from __future__ import annotations

import importlib.util

TRACKERS = ("tensorboard", "wandb", "mlflow")
TRACKER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
TRACKER_INSTALL = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}


def missing_packages(names: list[str]) -> list[str]:
    """`pip install` names of the trackers in `names` whose package cannot be imported."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(TRACKER_MODULES[name]) is not None
        except ValueError:  # a module in sys.modules without a spec
            found = True
        if not found:
            missing.append(TRACKER_INSTALL[name])
    return missing

"""The probes' cost priors: seconds per tap of each built-in probe, relative to the k-NN probe.

A run with several processes shares its probes out by these priors until each probe has been timed on a first tap
(`pipeline.probe_sharing.prior_costs`, `probes.declaration.Probe.cost`). This script measures them: one
`headprobe run` of `recipes/quickstart.yaml` (1 process; 3 training epochs and one seed, which change the heads but
not what probing them costs) with the rotation probe added, every built-in probe's function timed on every
(tap, seed) unit it runs on (the probe alone: not its intervals, not the tap's features). The result is each probe's
mean seconds per unit and its ratio to the k-NN probe's, next to the declared prior. With --quick: 300 training
and 120 test images, 2 epochs.

    python benchmarks/bench_probe_costs.py [--quick]
"""

from __future__ import annotations

import dataclasses
import importlib
import statistics
import tempfile
import time
from pathlib import Path

from _common import Report, parse_args

from headprobe import run
from headprobe.probes.declaration import declared_probes
from headprobe.recipe import resolve_recipe_data
from headprobe.registry import PROBES


def quickstart_recipe(quick: bool) -> dict:
    overrides = ["train.epochs=3", "seeds=null", "report=false", "probes.rotation={}"]
    if quick:
        overrides += ["data.limit.train=300", "data.limit.test=120", "train.epochs=2", "probes.orbits.n_images=8"]
    return resolve_recipe_data(Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml", overrides, None)


def timed_probes(seconds: dict[str, list[float]]) -> list[tuple[object, str, object]]:
    """Replace each built-in probe's declaration by one whose function records its time; returns what to restore."""
    restore = []
    for probe in declared_probes():
        module_name, _, attribute = PROBES.entry(probe.name).target.partition(":")
        module = importlib.import_module(module_name)

        def timed(tap, _function=probe.function, _name=probe.name, **options):
            start = time.perf_counter()
            out = _function(tap, **options)
            seconds.setdefault(_name, []).append(time.perf_counter() - start)
            return out

        restore.append((module, attribute, probe))
        setattr(module, attribute, dataclasses.replace(probe, function=timed))
    return restore


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], repeats=1, quick_repeats=1)
    recipe = quickstart_recipe(args.quick)
    sizes = {"recipe": "recipes/quickstart.yaml + probes.rotation", "data_limit": recipe["data"].get("limit"),
             "epochs": recipe["train"]["epochs"]}
    report = Report("probe_costs", args, sizes)
    seconds: dict[str, list[float]] = {}
    restore = timed_probes(seconds)
    try:
        with tempfile.TemporaryDirectory() as folder:
            run(recipe, out=Path(folder) / "run", quiet=True)
    finally:
        for module, attribute, probe in restore:
            setattr(module, attribute, probe)
    knn = statistics.mean(seconds["knn"])
    declared = {probe.name: probe.cost for probe in declared_probes()}
    costs = {}
    for name, times in seconds.items():
        report.timing(name, times, units=len(times))
        costs[name] = {"mean_s_per_unit": round(statistics.mean(times), 4), "units": len(times),
                       "relative_to_knn": round(statistics.mean(times) / knn, 2), "declared_prior": declared.get(name)}
        print(f"   {name}: {costs[name]['relative_to_knn']:g} x k-NN (declared prior {declared.get(name)})")
    report.extra["relative_costs"] = costs
    report.note("Timings are each probe's function alone on every (tap, seed) unit of one run; each unit's probes run "
                "in the recipe's order, so a probe's time includes no other probe's.")
    report.finish()


if __name__ == "__main__":
    main()

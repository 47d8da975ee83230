"""Recipe typing: headprobe's own checker (`recipe.loading`, `recipe.checks`) against pydantic's `TypeAdapter` over the
same schema dataclasses (`extra="forbid"`, lax mode: strict mode refuses a dict for a dataclass field), on recipes
with one mistake each, the mistakes users make. For each: whether it is refused, and whether the message names the
key and the fix (the allowed values, the likely name, or the YAML spelling). Also the time to check a valid recipe
(microseconds; it is not why either is chosen). Written for issue #37's question, whether pydantic could do the
recipe typing: the JSON says what it would leave to hand-written validators.

    python benchmarks/bench_recipe_typing.py [--quick]
"""

from __future__ import annotations

import dataclasses
import time

from _common import Report, parse_args

# (label, recipe data, what a message that names the fix contains)
CASES = [
    ("lr written 1e-3 in YAML 1.1 (a string)", {"train": {"lr": "1e-3"}}, "1.0e-3"),
    ("lr not a number", {"train": {"lr": "abc"}}, "number"),
    ("unknown key in a head, typo", {"heads": [{"name": "h", "widht": 3}]}, "width"),
    ("choice misspelt", {"features": {"precision": "fp61"}}, "fp32"),
    ("objective name misspelt", {"objective": {"name": "vicrge"}}, "vicreg"),
    ("probe name misspelt", {"probes": {"knnn": None}}, "knn"),
    ("probe option misspelt", {"probes": {"knn": {"kk": 5}}}, "k"),
    ("fractional epochs", {"train": {"epochs": 2.5}}, "integer"),
    ("negative batch size", {"features": {"batch_size": -1}}, "1"),
    ("boolean as the string 'yes'", {"features": {"cache": "yes"}}, "true or false"),
    ("lr NaN", {"train": {"lr": float("nan")}}, "finite"),
    ("activation misspelt", {"heads": [{"name": "h", "act": "rleu"}]}, "relu"),
    ("predictor with an objective that takes none", {"heads": [{"name": "h", "predictor": 64}],
                                                    "objective": {"name": "vicreg"}}, "predictor"),
    ("sweep label naming the parent folder", {"sweep": {"seed": [0, 1]}, "sweep_labels": ["..", "b"]}, ".."),
]
VALID = {"heads": [{"name": "h", "depth": 2, "width": 64}], "objective": {"name": "info_nce"},
         "train": {"epochs": 2, "lr": 1e-3}}


def pydantic_adapter():
    """A TypeAdapter of `Recipe` whose dataclasses forbid unknown keys (pydantic reads `__pydantic_config__` from a
    stdlib dataclass; set here, in this process only)."""
    from pydantic import ConfigDict, TypeAdapter

    from headprobe.recipe import schema

    for name in dir(schema):
        obj = getattr(schema, name)
        if isinstance(obj, type) and dataclasses.is_dataclass(obj):
            obj.__pydantic_config__ = ConfigDict(extra="forbid")
    return TypeAdapter(schema.Recipe)


def outcome(check, data) -> tuple[bool, str]:
    """(refused, message)."""
    try:
        check(data)
    except Exception as err:  # noqa: BLE001 - each library raises its own error type; the message is the point
        return True, " ".join(str(err).split())
    return False, ""


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], repeats=30, quick_repeats=5)
    from headprobe.recipe.loading import load_recipe

    adapter = pydantic_adapter()
    checkers = {"headprobe": load_recipe, "pydantic": adapter.validate_python}
    report = Report("recipe_typing", args, {"cases": len(CASES)})
    rows, counts = [], {name: {"refused": 0, "names_fix": 0} for name in checkers}
    for label, data, fix in CASES:
        row = {"case": label, "recipe": repr(data), "fix_contains": fix}
        for name, check in checkers.items():
            refused, message = outcome(check, data)
            names_fix = refused and fix in message
            counts[name]["refused"] += refused
            counts[name]["names_fix"] += names_fix
            row[name] = {"refused": refused, "names_fix": names_fix, "message": message[:400]}
        rows.append(row)
        print(f"   {label}: headprobe {'refused' if row['headprobe']['refused'] else 'ACCEPTED'}"
              f"{' (fix named)' if row['headprobe']['names_fix'] else ''}; pydantic "
              f"{'refused' if row['pydantic']['refused'] else 'ACCEPTED'}"
              f"{' (fix named)' if row['pydantic']['names_fix'] else ''}", flush=True)
    medians = {}
    for name, check in checkers.items():
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            check(VALID)
            times.append(time.perf_counter() - start)
        medians[name] = report.timing(f"{name} valid recipe", times) * 1e6
    n = len(CASES)
    for name, c in counts.items():
        report.check(f"{name}: bad recipes refused, fix named", "each case's mistake", f"{n}/{n}",
                     f"{c['refused']}/{n} refused, {c['names_fix']}/{n} name the fix",
                     c["refused"] == n and c["names_fix"] == n, **c)
    report.extra["cases"] = rows
    ours, theirs = medians["headprobe"], medians["pydantic"]
    report.note(f"time to check a valid recipe: headprobe {ours:.0f} us (types, ranges, registries and the checks "
                f"across fields), pydantic {theirs:.0f} us (types only); neither matters beside a run")
    report.finish()


if __name__ == "__main__":
    main()

"""Plug-ins from installed packages: backbones, data sources, probes, heads and objectives found through package
entry points, so that ``headprobe run``, ``headprobe list``, ``accelerate launch`` and ``torchrun`` see them.

Two ways to declare one in a package's ``pyproject.toml``:

- one entry per name, in the family's group; the name is the registry name, the value the object
  (imported only when a recipe uses it)::

      [project.entry-points."headprobe.backbones"]
      mine = "my_pkg.models:load_mine"          # backbone.id: mine:<ref>; load_mine(ref, *, seed=0) -> Backbone
      [project.entry-points."headprobe.objectives"]
      my_loss = "my_pkg.losses:my_loss"         # objective.name: my_loss

- a function in the group ``headprobe.plugins``, called once with the registries by family name
  (`registry.FAMILIES`), for entries that declare more: a probe declared as the built-in ones are
  (`probes.declaration.Probe`: help, needs, options, its metrics and their roles), so that the glossary, the
  report and the verdict read its metrics (``examples/plugin``)::

      [project.entry-points."headprobe.plugins"]
      my_pkg = "my_pkg.headprobe_plugin:register"
      # def register(registries): registries["probes"].declare("mine", "my_pkg.headprobe_plugin:MINE")

  (`Registry.add(name, target, help, needs=..., options=...)`, the older way, still registers a bare probe
  function: it runs, validates and lists, but its metrics are undeclared, so never evidence.)

The contracts are the built-ins': a backbone loader takes the reference after ``name:`` and keyword options and
returns a `Backbone` or a bare module (`backbones.own_module`); a data source ``(ref, revision=None, **options)`` ->
(`datasets.DatasetDict`, fingerprint); a probe ``(tap: TapData, **options)`` -> `ProbeOutput`; a head type
``(in_dim, spec: HeadSpec)`` -> a module with ``taps(x)``, ``depth`` and ``out_dim`` (`engine.build_head`); an
objective ``(z1, z2, **options)`` -> `LossTerms` (``(p1, p2, z1, z2, **options)`` for one that takes the heads'
predictor outputs, as simsiam does; `recipe.objective_inputs.takes_predictor`). A plug-in that fails to load is
skipped with a warning naming its package; a name already taken is refused the same way. An entry whose module
cannot be found is skipped at start-up (one warning line) and one that fails when first imported is taken out then
(`Registry.set_unavailable`): nothing imports it again, a run that does not name it is not touched, and a recipe
naming it is refused by `validate` with the import error's first line.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from typing import Any

# Entry-point group → the family (`registry.FAMILIES` key) its entries join.
FAMILY_GROUPS = {"headprobe.backbones": "backbones", "headprobe.data": "data", "headprobe.probes": "probes",
                 "headprobe.heads": "heads", "headprobe.objectives": "objectives"}
PLUGIN_GROUP = "headprobe.plugins"
_PREFIXED = {"backbones": "{name}:<ref>", "data": "{name}:<ref>"}


def _origin(entry_point: metadata.EntryPoint) -> str:
    dist = entry_point.dist
    return f"{dist.name} {dist.version}" if dist is not None else entry_point.value


def import_problem(target: str) -> Exception | None:
    """Why the module of `target` ("package.module:attribute") cannot be imported, found without importing it (its
    parent packages are), or None where it can be found."""
    module = target.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except Exception as err:  # a parent package that fails on import, or a module without a spec
        return err
    return ModuleNotFoundError(f"No module named {module!r}") if spec is None else None


def load_plugins(families: Mapping[str, Any],
                 entry_points: Callable[[str], Iterable[metadata.EntryPoint]] | None = None) -> list[str]:
    """Register every installed plug-in into `families` ({family: Registry}); returns "family:name" (or the
    register function's package) of each one taken. `entry_points(group=...)` lists a group's entry points (default:
    the installed packages', read once)."""
    if entry_points is None:
        entry_points = metadata.entry_points().select  # one scan of the installed packages, for every group
    taken = []
    for group, family in FAMILY_GROUPS.items():
        registry = families[family]
        for ep in entry_points(group=group):
            usage = _PREFIXED.get(family, "{name}").format(name=ep.name)
            try:
                registry.add(ep.name, ep.value, f"plug-in from {_origin(ep)}", usage)
            except ValueError as err:
                warnings.warn(f"headprobe plug-in {ep.name!r} ({group}, from {_origin(ep)}) was not registered: "
                              f"{err} Rename it in that package's entry points.", stacklevel=2)
                continue
            if (problem := import_problem(ep.value)) is not None:
                registry.set_unavailable(ep.name, problem, _origin(ep))  # one warning line; a recipe naming it: why
                continue
            taken.append(f"{family}:{ep.name}")
    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            register = ep.load()
            register(families)
        except Exception as err:  # a broken plug-in must not stop headprobe itself
            warnings.warn(f"headprobe plug-in {ep.value!r} (from {_origin(ep)}) failed to register "
                          f"({type(err).__name__}: {err}); headprobe runs without it. Fix or uninstall that "
                          "package.", stacklevel=2)
            continue
        taken.append(ep.name)
    return taken

"""What a recipe's probes need extracted beyond the clean features, read from what they declare (`needs`, from
`registry.PROBE_INPUTS`: their registry entries, `probes.declaration.Probe`), never from their names: the pipeline
extracts exactly this (`pipeline.stages.extract_features`) and `headprobe plan` counts it."""

from __future__ import annotations

from dataclasses import dataclass

from ..registry import PROBES
from .schema import Recipe, RecipeError


@dataclass(frozen=True)
class OrbitRequest:
    """The orbit frames to extract: the first `n_images` test images along each of `sweeps`, as the recipe's probes
    that need orbits (`probes`) ask in their options."""

    sweeps: tuple[str, ...]
    n_images: int
    probes: tuple[str, ...]


def probe_needs(recipe: Recipe) -> set[str]:
    """The inputs the recipe's probes declare they need ("views", "rotated", "orbits")."""
    return {need for name in recipe.probes for need in PROBES.entry(name).needs}


def orbit_request(recipe: Recipe) -> OrbitRequest | None:
    """The orbits the recipe's probes need, or None when none does. A probe that needs orbits names the frames in
    its options (`sweeps`, `n_images`); the orbits are extracted once, so every such probe must ask for the same
    ones (each measures every orbit it is given). A RecipeError says what to change otherwise."""
    asking = [name for name in recipe.probes if "orbits" in PROBES.entry(name).needs]
    asked = {}
    for name in asking:
        options = recipe.probes[name]
        if not (hasattr(options, "sweeps") and hasattr(options, "n_images")):
            raise RecipeError(f"probe {name!r} needs orbits, but its options name no `sweeps` and `n_images` (the "
                              "orbit frames to extract); declare both in its options dataclass.")
        asked[name] = (tuple(options.sweeps), options.n_images)
    if len(set(asked.values())) > 1:
        raise RecipeError(f"probes {', '.join(asking)} need orbits, which are extracted once, but ask for different "
                          f"ones ({'; '.join(f'{n}: {s}, n_images {k}' for n, (s, k) in asked.items())}); give them "
                          "the same sweeps and n_images.")
    return OrbitRequest(*next(iter(asked.values())), tuple(asking)) if asked else None

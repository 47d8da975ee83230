"""Recipes: YAML → typed, validated objects, with ``--set key.sub=value`` overrides and sweeps.

`schema` declares the sections (each field's type, default, range and registered names), `loading` reads YAML,
applies overrides and sweeps and checks every field against its declaration, and `checks` relates fields to each
other. Everything is checked before a model loads; a refusal is a `RecipeError` naming the key path, the bad
value, the allowed values and a "did you mean".
"""

from .checks import check_recipe, declared_shape, known_train_size, patch_size
from .loading import apply_override, dump_recipe, expand_sweep, load_recipe, resolve_recipe_data, set_value
from .schema import (
    NAME_PATTERN,
    AugmentRecipe,
    BackboneSpec,
    DataSpec,
    FeatureSpec,
    GeometrySpec,
    HeadSpec,
    LimitSpec,
    LoraSpec,
    NoOptions,
    ObjectiveSpec,
    Range,
    Recipe,
    RecipeError,
    RuntimeSpec,
    TrainSpec,
)
from .sweeps import MAX_FOLDER_BYTES, sweep_folder_name

__all__ = [
    "MAX_FOLDER_BYTES", "NAME_PATTERN",
    "AugmentRecipe", "BackboneSpec", "DataSpec", "FeatureSpec", "GeometrySpec", "HeadSpec",
    "LimitSpec", "LoraSpec", "NoOptions", "ObjectiveSpec", "Range",
    "Recipe", "RecipeError", "RuntimeSpec", "TrainSpec", "apply_override",
    "check_recipe", "declared_shape", "dump_recipe", "expand_sweep", "known_train_size", "load_recipe", "patch_size",
    "resolve_recipe_data", "set_value", "sweep_folder_name",
]

"""The checks of a `type: pretrained` head: the head stored in an ``ssl:<format>:<path>`` checkpoint (its keys and
shapes, read with weights_only on the meta device), or a CLIP-family backbone's own image projection (a local
transformers directory's model type and the pooling its projection takes). No model is loaded."""

from __future__ import annotations

import json
from pathlib import Path

from .schema import Recipe, RecipeError

__all__ = ["check_image_projection", "check_pretrained_heads", "check_ssl_checkpoint"]

# transformers' model types whose checkpoints hold CLIP's `visual_projection` (`backbones.hf.PROJECTION_MODEL_TYPES`,
# repeated here so that validating imports no model library; `tests/test_clip_projection.py` ties the two).
PROJECTION_MODEL_TYPES = ("clip", "clip_vision_model")


def check_pretrained_heads(recipe: Recipe) -> None:
    """Every check of the recipe's `type: pretrained` heads against its backbone."""
    check_ssl_checkpoint(recipe)
    check_image_projection(recipe)


def check_ssl_checkpoint(recipe: Recipe) -> None:
    """An ``ssl:<format>:<path>`` backbone's file exists and its keys and shapes are the format's (read with
    weights_only, modules rebuilt on the meta device: no model is loaded). The one check that imports torch."""
    spec = recipe.backbone
    if not spec.id.startswith("ssl:"):
        return
    from ..ssl import inspect_checkpoint

    pretrained = [h.name for h in recipe.heads if h.type == "pretrained"]
    act = next((h.act for h in recipe.heads if h.type == "pretrained"), None)
    try:
        expects = inspect_checkpoint(spec.id, part=spec.part, num_heads=spec.num_heads, head=bool(pretrained), act=act)
    except (ValueError, OSError) as err:
        raise RecipeError(f"backbone.id = {spec.id!r}: {err}") from None
    if pretrained and expects.get("pooling") not in (None, spec.pooling):
        raise RecipeError(f"heads: {pretrained[0]!r} is {spec.id}'s own head, trained on {expects['pooling']!r} "
                          f"features, but backbone.pooling = {spec.pooling!r}; set backbone.pooling: "
                          f"{expects['pooling']}.")
    if pretrained and expects.get("layer") == -1 and (spec.layer != -1 or spec.layers is not None):
        chosen = f"backbone.layers = {spec.layers}" if spec.layers is not None else f"backbone.layer = {spec.layer}"
        raise RecipeError(f"heads: {pretrained[0]!r} is {spec.id}'s own head, trained on the backbone's final "
                          f"features, but {chosen}; remove it (layer -1) to probe the head on what it was trained "
                          "on.")


def check_image_projection(recipe: Recipe) -> None:
    """A `type: pretrained` head on an ``hf:`` backbone is CLIP's image projection: the input it takes is the
    post-layernormed class token (`pooling: cls` or `pooler`, final layer), and a local directory's `config.json`
    must be a CLIP model's. (An ``open_clip:`` tower's pooling is known once it is built: the run checks it.)"""
    spec = recipe.backbone
    names = [h.name for h in recipe.heads if h.type == "pretrained"]
    if not names or not spec.id.startswith("hf:"):
        return
    if spec.pooling not in ("cls", "pooler"):
        raise RecipeError(f"heads: {names[0]!r} is {spec.id}'s image projection, which takes the post-layernormed "
                          f"class token, but backbone.pooling = {spec.pooling!r}; set backbone.pooling: cls.")
    if spec.layer != -1 or spec.layers is not None:
        raise RecipeError(f"heads: {names[0]!r} is {spec.id}'s image projection, which takes the final layer's "
                          "features; remove backbone.layer / backbone.layers.")
    config = Path(spec.id[3:]) / "config.json"
    if not config.is_file():
        return  # a hub id: its config is read when the run loads it
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as err:
        raise RecipeError(f"backbone.id = {spec.id!r}: {config} cannot be read as a transformers config ({err}); "
                          "save the model again with save_pretrained.") from None
    if model_type not in PROJECTION_MODEL_TYPES:
        raise RecipeError(f"heads: {names[0]!r} is `type: pretrained` on {spec.id}, a {model_type!r} model, which has "
                          f"no image projection (only {', '.join(PROJECTION_MODEL_TYPES)} checkpoints have one); use "
                          "another head type.")

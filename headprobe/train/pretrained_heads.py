"""`heads: [{type: pretrained}]`: the head stored in the backbone's self-supervised checkpoint (`headprobe.ssl`), or a
CLIP-family backbone's own image projection (`headprobe.backbones.projection`), loaded frozen for the run;
`stages.train_heads` puts it next to the heads it trains, and it is never trained."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headprobe.backbones.projection import load_image_projection
from headprobe.recipe import RecipeError
from headprobe.ssl import load_pretrained_head

__all__ = ["PretrainedHead", "check_expected_features", "load_pretrained_heads"]


@dataclass
class PretrainedHead:
    """A head read from the backbone's self-supervised checkpoint (`headprobe.ssl`): frozen, never trained."""

    head: Any
    predictor: Any = None
    status: str = "pretrained (not trained)"
    last_loss: float | None = None
    message: str = ""


def check_expected_features(name: str, spec, expects: dict) -> None:
    """The backbone features the pretrained head `name` was trained on (`expects`: its pooling, one or a list, and
    layer -1 for the final layer) against the recipe's backbone spec; a RecipeError naming the setting to change."""
    poolings = expects.get("pooling")
    poolings = [poolings] if isinstance(poolings, str) else poolings
    if poolings and spec.pooling not in poolings:
        raise RecipeError(f"heads: {name!r} is {spec.id}'s own head, trained on {' or '.join(map(repr, poolings))} "
                          f"features, but backbone.pooling = {spec.pooling!r}; set backbone.pooling: {poolings[0]}.")
    if expects.get("layer") == -1 and (spec.layer != -1 or spec.layers is not None):
        chosen = f"backbone.layers = {spec.layers}" if spec.layers is not None else f"backbone.layer = {spec.layer}"
        raise RecipeError(f"heads: {name!r} is {spec.id}'s own head, trained on the backbone's final features, but "
                          f"{chosen}; remove it (layer -1) to probe the head on what it was trained on.")


def load_pretrained_heads(ctx) -> dict[str, PretrainedHead]:
    """{name: head} for the recipe's `type: pretrained` heads: the head stored in the backbone's checkpoint
    (`backbone.id: ssl:<format>:<path>`, the same `part`, the head's `act` where the file cannot show it), checked
    against the features it was trained on."""

    out = {}
    spec = ctx.recipe.backbone
    for head_spec in (h for h in ctx.recipe.heads if h.type == "pretrained"):
        what = f"loading the pretrained head {head_spec.name!r}"
        with ctx.stage(what):
            if spec.id.startswith("ssl:"):
                head = load_pretrained_head(spec.id, part=spec.part, act=head_spec.act)
            else:  # a CLIP-family backbone's own image projection
                head = load_image_projection(spec.id, seed=ctx.recipe.seed, revision=spec.revision,
                                             resolution=spec.resolution)
        check_expected_features(head_spec.name, spec, getattr(head, "expects", {}) or {})
        if head_spec.taps and max(head_spec.taps) > head.depth:
            message = (f"heads: {head_spec.name!r} ({spec.id}'s own head) has {head.depth} layers, so taps "
                       f"{[d for d in head_spec.taps if d > head.depth]} do not exist; choose among 1..{head.depth}.")
            ctx.record_stop("failed", f"loading the pretrained head {head_spec.name!r}", message, report=False)
            raise RecipeError(message)
        out[head_spec.name] = PretrainedHead(head)
    return out

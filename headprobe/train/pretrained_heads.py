"""`heads: [{type: pretrained}]`: the head stored in the backbone's self-supervised checkpoint (`headprobe.ssl`),
loaded frozen for the run; `stages.train_heads` puts it next to the heads it trains, and it is never trained."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headprobe.recipe import RecipeError

__all__ = ["PretrainedHead", "load_pretrained_heads"]


@dataclass
class PretrainedHead:
    """A head read from the backbone's self-supervised checkpoint (`headprobe.ssl`): frozen, never trained."""

    head: Any
    predictor: Any = None
    status: str = "pretrained (not trained)"
    last_loss: float | None = None
    message: str = ""


def load_pretrained_heads(ctx) -> dict[str, PretrainedHead]:
    """{name: head} for the recipe's `type: pretrained` heads: the head stored in the backbone's checkpoint
    (`backbone.id: ssl:<format>:<path>`, the same `part`, the head's `act` where the file cannot show it), checked
    against the features it was trained on."""
    from headprobe.ssl import load_pretrained_head

    out = {}
    spec = ctx.recipe.backbone
    for head_spec in (h for h in ctx.recipe.heads if h.type == "pretrained"):
        head = ctx.stage(f"loading the pretrained head {head_spec.name!r}", load_pretrained_head, spec.id,
                         part=spec.part, act=head_spec.act)
        expects = getattr(head, "expects", {}) or {}
        if expects.get("pooling") not in (None, spec.pooling):
            raise RecipeError(f"heads: {head_spec.name!r} is {spec.id}'s own head, trained on "
                              f"{expects['pooling']!r} features, but backbone.pooling = {spec.pooling!r}; set "
                              f"backbone.pooling: {expects['pooling']}.")
        if head_spec.taps and max(head_spec.taps) > head.depth:
            message = (f"heads: {head_spec.name!r} ({spec.id}'s own head) has {head.depth} layers, so taps "
                       f"{[d for d in head_spec.taps if d > head.depth]} do not exist; choose among 1..{head.depth}.")
            ctx.record_stop("failed", f"loading the pretrained head {head_spec.name!r}", message, report=False)
            raise RecipeError(message)
        out[head_spec.name] = PretrainedHead(head)
    return out

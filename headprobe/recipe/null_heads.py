"""Null heads in a recipe: heads that are never trained, probed like every head, so each change a trained head
makes is read against what "no training" gives on the same measure.

Two kinds (`Recipe.null_heads`, or written out as heads):

- **init** — for each trained head ``H`` an untrained copy ``H.init`` at its initialisation: the very weights ``H``
  started from (`train.engine.build_head` draws them from (seed, ``H``) alone), in eval mode (BatchNorm on its
  initial running statistics). Δ(H) − Δ(H.init) is what *training* the head did, beyond what its architecture does
  to the features at random weights.
- **random** — a fixed random injective linear map (`RandomInjectiveMap`): Gaussian weights, output width at least
  the input's, so no information is lost. A probe that moves under it measures the probe, not the head.

A recipe's ``null_heads: [init]`` adds ``{name: H.init, init_of: H}`` for every trainable head; a head written
with ``init_of: H`` takes every setting of ``H`` (so a sweep that changes ``H`` changes its copy too).

>>> specs = with_null_heads([HeadSpec(name="lin", type="linear", depth=2, width=64)], ["init", "random"])
>>> [(s.name, s.type, s.init_of) for s in specs]
[('lin', 'linear', None), ('lin.init', 'linear', 'lin'), ('random', 'random', None)]
"""

from __future__ import annotations

import dataclasses

from headprobe.recipe.schema import HeadSpec
from headprobe.registry import UNTRAINED_HEAD_TYPES

NULL_KINDS = ("init", "random")
RANDOM_NAME = "random"


def is_null(spec) -> bool:
    """A head that is never trained: an initialisation copy (`init_of`) or a random injective map."""
    return getattr(spec, "init_of", None) is not None or getattr(spec, "type", None) == "random"


def trainable_specs(specs) -> list:
    """The heads a training loop updates: neither a checkpoint's own head nor a null head."""
    return [s for s in specs if s.type != "pretrained" and not is_null(s)]


def with_null_heads(heads: list[HeadSpec], kinds) -> list[HeadSpec]:
    """heads with every `init_of` copy re-derived from its twin (every setting but the name), then the null heads
    `kinds` asks for that are not there yet: ``H.init`` per trainable head, one ``random`` map as wide as the
    widest trained head."""
    by_name = {h.name: h for h in heads}
    out = []
    for head in heads:
        twin = by_name.get(head.init_of) if head.init_of is not None else None
        out.append(dataclasses.replace(twin, name=head.name, init_of=twin.name) if twin is not None and
                   twin.init_of is None else head)
    names = {h.name for h in out}
    trained = [h for h in out if h.type not in UNTRAINED_HEAD_TYPES and h.init_of is None]
    if "init" in kinds:
        copies = {h.init_of for h in out if h.init_of is not None}
        for head in trained:
            name = f"{head.name}.init"
            if head.name not in copies and name not in names:
                out.append(dataclasses.replace(head, name=name, init_of=head.name))
                names.add(name)
    if "random" in kinds and not any(h.type == "random" for h in out) and RANDOM_NAME not in names:
        width = max((h.out_dim or h.width for h in trained), default=2048)
        out.append(HeadSpec(name=RANDOM_NAME, type="random", depth=1, width=width))
    return out


def null_of(heads, head: str) -> str | None:
    """The null a head's change is read against: its own initialisation copy, else the random map, else None
    (a null head has none)."""
    spec = next((h for h in heads if h.name == head), None)
    if spec is None or is_null(spec):
        return None
    copy = next((h.name for h in heads if getattr(h, "init_of", None) == head), None)
    return copy or next((h.name for h in heads if h.type == "random"), None)

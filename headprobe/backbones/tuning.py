"""Tuning policies (`backbone.tune`): which of a backbone's weights train together with the heads.

- ``frozen``: nothing trains; eval mode; features can be cached (the default, `Backbone.freeze`).
- ``last:N``: the last N of `backbone.blocks` and what follows them (the final norm, a CNN's head conv).
- ``lora``: low-rank adapters (peft) on the attention query/value projections of ViT-style models (the fused
  ``qkv`` projection in timm, ``nn.MultiheadAttention`` in open_clip) or on the ungrouped convolutions of
  a CNN's blocks; the original weights stay frozen. "We limit our study to only adapting the attention
  weights" (Hu et al., 2021, LoRA, §4.2), where they found W_q and W_v together the best choice.
- ``full``: every weight.

>>> backbone = load_backbone("scratch:vit-tiny")  # doctest: +SKIP
>>> apply_tuning(backbone, "last:1")["trainable"]  # doctest: +SKIP
445248
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from .base import Backbone, seeded

LORA_DEFAULTS = {"r": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": None}
_QV = ("query", "value", "q_proj", "v_proj", "q", "v")
_MANIFEST = "headprobe_backbone.json"


def parse_policy(policy: str) -> tuple[str, int | None]:
    """``"last:2"`` → ``("last", 2)``; ``"frozen"``/``"lora"``/``"full"`` → ``(policy, None)``."""
    if policy in ("frozen", "lora", "full"):
        return policy, None
    kind, sep, n = policy.partition(":")
    if kind == "last" and sep and n.isdigit() and int(n) >= 1:
        return "last", int(n)
    raise ValueError(f"tune policy {policy!r} is not one of: frozen, last:N (N >= 1 blocks), lora, full.")


def _is_plain_conv(module: nn.Module) -> bool:
    # Grouped (depthwise) convolutions and ones that pad inside forward() cannot carry a matching LoRA branch.
    return (isinstance(module, nn.Conv2d) and module.groups == 1
            and (type(module) is nn.Conv2d or module.kernel_size == (1, 1)))


def default_lora_targets(backbone: Backbone) -> list[str]:
    """Names (in `backbone.model`) of the modules LoRA adapts by default, all inside `backbone.blocks`:
    attention q/v linears; else a fused `qkv` linear; else `nn.MultiheadAttention`; else plain convolutions;
    else any linear layer (ConvNeXt's MLPs)."""
    inside = {id(m) for block in backbone.blocks for m in block.modules()}
    named = [(n, m) for n, m in backbone.model.named_modules() if id(m) in inside]
    rules = (
        lambda n, m: isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in _QV,
        lambda n, m: isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] == "qkv",
        lambda n, m: isinstance(m, nn.MultiheadAttention),
        lambda n, m: _is_plain_conv(m),
        lambda n, m: isinstance(m, nn.Linear),
    )
    for rule in rules:
        found = [n for n, m in named if rule(n, m)]
        if found:
            return found
    return []


def apply_tuning(
    backbone: Backbone,
    policy: str = "frozen",
    *,
    seed: int = 0,
    r: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    target_modules: list[str] | None = None,
) -> dict:
    """Make exactly the weights of `policy` trainable (in place) and return what `results.json` records:
    ``{"policy", "trainable", "total", ...}`` (LoRA adds r, alpha, dropout, target_modules).

    The backbone stays in eval mode; call `backbone.train()` in the training loop (frozen parts stay in eval
    mode) and `backbone.eval()` to extract features. `seed` fixes the LoRA initialisation. Extract the
    untuned features before calling this: `last:N` and `full` change the weights in place.
    """
    kind, n = parse_policy(policy)
    lora = {"r": r, "alpha": float(alpha), "dropout": float(dropout), "target_modules": target_modules}
    if kind != "lora" and lora != LORA_DEFAULTS:
        raise ValueError(f"LoRA options {lora} are set but the tune policy is {policy!r}; use tune: lora or drop them.")
    if backbone.tuning["policy"] != "frozen":
        raise ValueError(f"{backbone.id} is already tuned ({backbone.tuning['policy']}); load a fresh backbone.")
    base_fingerprint = backbone.fingerprint
    backbone.freeze()
    record: dict = {"policy": policy}
    if kind == "full":
        for p in backbone.model.parameters():
            p.requires_grad_(True)
    elif kind == "last":
        if len(backbone.blocks) < n:
            raise ValueError(f"tune {policy!r}: {backbone.id} has {len(backbone.blocks)} blocks, so N must be at "
                             f"most {len(backbone.blocks)}.")
        for module in [*backbone.blocks[-n:], *backbone.norm]:
            for p in module.parameters():
                p.requires_grad_(True)
    elif kind == "lora":
        record.update(_inject_lora(backbone, seed=seed, **lora))
    backbone.tuning = {**record, "trainable": backbone.trainable, "total": backbone.params,
                       "base_fingerprint": base_fingerprint}
    backbone.forget_fingerprint()
    return dict(backbone.tuning)


def _inject_lora(backbone: Backbone, *, seed: int, r: int, alpha: float, dropout: float,
                 target_modules: list[str] | None) -> dict:
    from peft import LoraConfig, get_peft_model

    targets = list(target_modules) if target_modules else default_lora_targets(backbone)
    if not targets:
        raise ValueError(f"{backbone.id}: its blocks hold no attention, convolution or linear layer LoRA could adapt; "
                         "set backbone.lora.target_modules to module names of the model.")
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")
    try:
        with seeded(seed):
            adapter = get_peft_model(backbone.model, config)
    except ValueError as err:
        raise ValueError(f"{backbone.id}: LoRA target_modules {targets[:6]} do not fit the model: {err}") from None
    # Not a registered sub-module: it wraps `backbone.model` itself, whose layers now carry the adapters.
    object.__setattr__(backbone, "adapter", adapter)
    leaves = sorted({t.rsplit(".", 1)[-1] for t in targets})
    return {"r": r, "alpha": alpha, "dropout": dropout, "target_modules": leaves, "n_adapted": len(targets)}


def save_adapter(backbone: Backbone, path: str | Path) -> Path:
    """Write the LoRA adapter (peft `save_pretrained`) and the id/fingerprint of the base backbone it belongs to."""
    adapter = getattr(backbone, "adapter", None)
    if adapter is None:
        raise ValueError(f"{backbone.id} has no LoRA adapter (tune policy {backbone.tuning['policy']!r}).")
    path = Path(path)
    adapter.save_pretrained(str(path))
    manifest = {"id": backbone.id, "base_fingerprint": backbone.tuning["base_fingerprint"], "tuning": backbone.tuning}
    (path / _MANIFEST).write_text(json.dumps(manifest, indent=1))
    return path


def load_adapter(backbone: Backbone, path: str | Path, *, trainable: bool = False) -> Backbone:
    """Attach a LoRA adapter saved by `save_adapter` to a freshly loaded (frozen) copy of the same backbone."""
    from peft import PeftModel

    path = Path(path)
    manifest = json.loads((path / _MANIFEST).read_text())
    if backbone.tuning["policy"] != "frozen":
        raise ValueError(f"{backbone.id} is already tuned ({backbone.tuning['policy']}); load a fresh backbone.")
    if manifest["base_fingerprint"] != backbone.fingerprint:
        raise ValueError(f"the adapter in {path} was trained on {manifest['id']} with weights "
                         f"{manifest['base_fingerprint']}, but this backbone is {backbone.id} with weights "
                         f"{backbone.fingerprint}.")
    adapter = PeftModel.from_pretrained(backbone.model, str(path), is_trainable=trainable)
    object.__setattr__(backbone, "adapter", adapter)
    backbone.tuning = {**manifest["tuning"], "trainable": backbone.trainable, "total": backbone.params,
                       "loaded_from": str(path)}
    backbone.forget_fingerprint()
    return backbone.eval()

"""open_clip visual towers: `open_clip:<arch>[/<pretrained tag or weights file>]`.

Built with `open_clip.create_model_and_transforms`, so weights and the preprocessing open_clip configures
for that tag travel together; only the visual tower is kept. Without a tag the architecture is randomly
initialised (from the seed), as in open_clip. `hf-hub:org/repo` and `local-dir:/path` ids pass through.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from .base import Backbone, BackboneNotFoundError, Preprocess
from .blocks import wrap_blocks
from .hf import cache_first
from .pooling import FINAL
from .processor import processor_preprocess

_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".safetensors", ".ckpt")
_RESIZE_MODES = {"shortest": "shortest", "squash": "square"}


def preprocess_from_open_clip(cfg: dict) -> Preprocess:
    """open_clip's `visual.preprocess_cfg` → its own validation transform (what `create_model_and_transforms`
    returns), with the resize, crop and normalisation it does."""
    size = cfg["size"]
    height, width = (size, size) if isinstance(size, int) else size
    if height != width:
        raise ValueError(f"open_clip image size {size} is not square; only square inputs are supported.")
    mode = cfg.get("resize_mode", "shortest")
    if mode not in _RESIZE_MODES:
        raise ValueError(f"open_clip resize_mode {mode!r} is not supported; supported: {', '.join(_RESIZE_MODES)}.")
    interpolation = cfg.get("interpolation", "bicubic")
    described = Preprocess(
        resize=height,
        crop=height,
        mean=tuple(float(m) for m in cfg["mean"]),
        std=tuple(float(s) for s in cfg["std"]),
        interpolation=interpolation if interpolation in ("bicubic", "bilinear", "nearest") else "bicubic",
        resize_mode=_RESIZE_MODES[mode],
    )
    return processor_preprocess(described, "open_clip", dict(cfg))


def _split(ref: str) -> tuple[str, str | None]:
    """`ViT-B-32/openai` → (`ViT-B-32`, `openai`); schema ids (`hf-hub:`, `local-dir:`) keep their slashes."""
    if ref.startswith(("hf-hub:", "local-dir:")):
        return ref, None
    arch, _, weights = ref.partition("/")
    return arch, weights or None


def _check_weights(open_clip, id: str, arch: str, weights: str) -> str:
    """A pretrained tag of `arch`, or the path of an existing file; otherwise a sentence saying which exist."""
    if Path(weights).expanduser().is_file():
        return str(Path(weights).expanduser())
    tags = open_clip.list_pretrained_tags_by_model(arch)
    if weights in tags:
        return weights
    if "/" in weights or weights.endswith(_WEIGHT_SUFFIXES):
        raise BackboneNotFoundError(f"{id}: weights file {weights!r} does not exist; give the path to a checkpoint "
                                    f"of {arch} (model.state_dict()) or a pretrained tag.")
    import difflib

    close = difflib.get_close_matches(weights, tags, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"{id}: {weights!r} is neither a weights file nor a pretrained tag of {arch}; tags: "
                     f"{', '.join(tags) or 'none'}.{hint}")


def _run_visual(visual: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    return visual(pixels)


def _resnet_trunk(visual: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """ModifiedResNet without its attention pool: (B, 3, H, W) → (B, C, h, w)."""
    x = visual.stem(pixels.to(visual.conv1.weight.dtype))
    for layer in (visual.layer1, visual.layer2, visual.layer3, visual.layer4):
        x = layer(x)
    return x


def wrap_visual(visual: nn.Module, *, id: str, pooling: str, layer: int, layers: list[int] | None,
                preprocess: Preprocess, description: str, options: dict) -> Backbone:
    """An open_clip visual tower as a `Backbone`; `pooler` is the tower's own (projected) image embedding."""
    from open_clip.modified_resnet import ModifiedResNet
    from open_clip.transformer import VisionTransformer

    common = dict(id=id, pooling=pooling, layer=layer, layers=layers, preprocess=preprocess,
                  description=description, options=options, pooler=_run_visual)
    if isinstance(visual, VisionTransformer) and visual.attn_pool is None:
        has_cls = getattr(visual, "class_embedding", None) is not None
        return wrap_blocks(visual, run=_run_visual, blocks=list(visual.transformer.resblocks), tokens=True,
                           norm=visual.ln_post, n_prefix=int(has_cls), **common)
    if isinstance(visual, ModifiedResNet):
        blocks = [b for layer_ in (visual.layer1, visual.layer2, visual.layer3, visual.layer4) for b in layer_]
        return wrap_blocks(visual, run=_resnet_trunk, blocks=blocks, tokens=False, **common)
    if pooling != "pooler" or layers is not None or layer != FINAL:
        raise ValueError(f"{id}: its visual tower is a {type(visual).__name__}, whose tokens headprobe cannot read; "
                         "only pooling 'pooler' (the tower's own embedding) on the final layer is supported.")
    return wrap_blocks(visual, run=_run_visual, blocks=[], tokens=False, **common)


def load_open_clip(
    ref: str,
    *,
    pooling: str = "cls",
    resolution: int | None = None,
    layer: int = FINAL,
    layers: list[int] | None = None,
    seed: int | None = None,
) -> Backbone:
    """Load `open_clip:<ref>`; see the module docstring for the forms of `ref`."""
    import open_clip

    id = f"open_clip:{ref}"
    arch, weights = _split(ref)
    if not arch.startswith(("hf-hub:", "local-dir:")) and arch not in open_clip.list_models():
        import difflib

        close = difflib.get_close_matches(arch, open_clip.list_models(), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"{id}: open_clip has no architecture {arch!r} (see open_clip.list_models()).{hint}")
    pretrained = _check_weights(open_clip, id, arch, weights) if weights else None

    def create():
        return open_clip.create_model_and_transforms(arch, pretrained=pretrained, force_image_size=resolution)[0]

    local = pretrained is None or Path(pretrained).is_file() or arch.startswith("local-dir:")
    try:
        model = create() if local else cache_first(create)
    except (OSError, RuntimeError) as err:
        if local:
            raise
        raise BackboneNotFoundError(
            f"{id}: the weights of {pretrained or arch!r} are not in the Hugging Face cache "
            f"({os.environ.get('HF_HOME', '~/.cache/huggingface')}) and could not be downloaded ({err}); on a machine "
            f"with network run `python -c \"import open_clip; open_clip.create_model('{arch}', "
            f"pretrained={pretrained!r})\"` and copy the cache, or use open_clip:<arch>/<weights file>."
        ) from err
    visual = model.visual.eval()
    if arch.startswith(("hf-hub:", "local-dir:")):
        source = f"config and weights from {arch}"
    elif pretrained is None:
        source = f"randomly initialised (seed {seed})"
    else:
        source = f"weights {'file' if Path(pretrained).is_file() else 'tag'} {pretrained}"
    return wrap_visual(
        visual,
        id=id,
        pooling=pooling,
        layer=layer,
        layers=layers,
        preprocess=preprocess_from_open_clip(visual.preprocess_cfg),
        description=f"open_clip {arch} visual tower ({type(visual).__name__}), {source}; preprocessing: open_clip's "
                    "own validation transform",
        options={"pooling": pooling, "resolution": resolution, "layer": layer, "layers": layers},
    )


def open_clip_image_projection(visual: nn.Module, id: str) -> tuple[torch.Tensor, str]:
    """(the image projection `visual.proj`, (width, embed_dim), the `pooling` whose features are its input) of an
    open_clip ViT tower: `pooled @ proj` is the tower's image embedding, `pooled` the ln_post-normed class token
    (`pool_type` 'tok': pooling cls) or the mean of the normed patch tokens ('avg': pooling mean). Towers whose
    pooled input headprobe's poolings do not reproduce (attention pooling, the norm after an average) are refused."""
    from open_clip.transformer import VisionTransformer

    proj = getattr(visual, "proj", None)
    if not isinstance(visual, VisionTransformer) or proj is None:
        raise ValueError(f"{id}: its visual tower ({type(visual).__name__}) has no `proj` image projection, so a "
                         "`type: pretrained` head cannot be read from it; use another head type.")
    tok = visual.pool_type == "tok" and getattr(visual, "class_embedding", None) is not None
    if visual.attn_pool is not None or not (tok or (visual.pool_type == "avg" and not visual.final_ln_after_pool)):
        how = "attention" if visual.attn_pool is not None else repr(visual.pool_type)
        raise ValueError(f"{id}: its visual tower pools with {how}"
                         f"{' and normalises after pooling' if visual.final_ln_after_pool else ''}, which no "
                         "headprobe pooling reproduces, so its projection's input cannot be tapped; use another "
                         "head type.")
    return proj.detach(), "cls" if tok else "mean"

"""The Vision Transformer of DINO (facebookresearch/dino, ``vision_transformer.py``), rebuilt with the same
module names so that its state dict loads key for key:

``cls_token (1,1,D) · pos_embed (1,1+N,D) · patch_embed.proj.{weight,bias} · blocks.{i}.norm1 · blocks.{i}.attn.qkv
· blocks.{i}.attn.proj · blocks.{i}.norm2 · blocks.{i}.mlp.fc1 · blocks.{i}.mlp.fc2 · norm`` (the classifier
``head`` is an ``nn.Identity`` in DINO's MultiCropWrapper and has no tensors).

Pre-norm blocks, GELU MLP, LayerNorm eps 1e-6 (``vit_tiny/small/base``). The forward pass returns the tokens after
the last block, before the final norm; `headprobe.backbones.blocks` applies ``norm`` and pools, so pooling ``cls``
on layer -1 is DINO's ``VisionTransformer.forward`` (``norm(x)[:, 0]``). Positional embeddings are interpolated
for other input sizes exactly as DINO's ``interpolate_pos_encoding`` does.

The patch embedding and the blocks are timm's (`timm.layers.PatchEmbed`, `timm.models.vision_transformer.Block`:
DINO's layers under DINO's names, with PyTorch's fused attention); only the position embedding's interpolation is
DINO's own, which timm's resampling does not reproduce. tests/test_ssl_dino.py compares the features with DINO's
forward pass written out.
"""

from __future__ import annotations

import functools
import math
import re

import torch
from torch import nn

from .checkpoint import SSLCheckpointError

# num_heads of DINO's named ViTs (vision_transformer.py: vit_tiny, vit_small, vit_base); head width is 64 in all.
DINO_VIT_HEADS = {"vit_tiny": 3, "vit_small": 6, "vit_base": 12}


class DinoViT(nn.Module):
    """DINO's ViT: (B, 3, H, W) → (B, 1 + N, D) tokens after the last block (final `norm` not applied)."""

    def __init__(self, *, patch_size: int, dim: int, depth: int, num_heads: int, mlp_hidden: int,
                 num_patches: int, qkv_bias: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embedding width {dim} is not divisible by num_heads={num_heads}.")
        from timm.layers import PatchEmbed
        from timm.models.vision_transformer import Block

        self.embed_dim = dim
        self.patch_size = patch_size
        self.patch_embed = PatchEmbed(img_size=None, patch_size=patch_size, embed_dim=dim, strict_img_size=False)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, dim))
        norm = functools.partial(nn.LayerNorm, eps=eps)
        # timm sizes the MLP as int(dim · mlp_ratio); the half keeps that at mlp_hidden whatever the rounding.
        ratio = (mlp_hidden + 0.5) / dim
        self.blocks = nn.ModuleList(
            Block(dim, num_heads, mlp_ratio=ratio, qkv_bias=qkv_bias, norm_layer=norm) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=eps)

    def interpolate_pos_encoding(self, x: torch.Tensor, w: int, h: int) -> torch.Tensor:
        """DINO's rule: bicubic resize of the patch grid by (w/p + 0.1)/√N, (h/p + 0.1)/√N."""
        npatch, n = x.shape[1] - 1, self.pos_embed.shape[1] - 1
        if npatch == n and w == h:
            return self.pos_embed
        cls_pos, patch_pos = self.pos_embed[:, 0], self.pos_embed[:, 1:]
        dim, side = x.shape[-1], int(math.sqrt(n))
        w0 = w // self.patch_size + 0.1
        h0 = h // self.patch_size + 0.1
        patch_pos = nn.functional.interpolate(
            patch_pos.reshape(1, side, side, dim).permute(0, 3, 1, 2),
            scale_factor=(w0 / math.sqrt(n), h0 / math.sqrt(n)), mode="bicubic",
        )
        patch_pos = patch_pos.permute(0, 2, 3, 1).reshape(1, -1, dim)
        return torch.cat((cls_pos.unsqueeze(0), patch_pos), dim=1)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        _, _, w, h = pixels.shape
        x = self.patch_embed(pixels)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.interpolate_pos_encoding(x, w, h)
        for block in self.blocks:
            x = block(x)
        return x


def tensor_shape(state: dict, key: str, what: str, layout: str) -> tuple[int, ...]:
    """The shape of `state[key]`, or an error saying the model cannot be rebuilt without it."""
    if key not in state or not isinstance(state[key], torch.Tensor):
        raise SSLCheckpointError(f"{what}: tensor {key!r} is missing, so the model cannot be rebuilt. "
                                 f"Expected {layout}")
    return tuple(state[key].shape)


def vit_from_keys(state: dict, *, num_heads: int, what: str, layout: str, patch_size: int | None = None) -> DinoViT:
    """An unloaded `DinoViT` shaped like `state`: width, depth, MLP width, patch grid and qkv bias read from the
    tensors (DINO's and timm's ViTs share these key names); `patch_size` where the run recorded it."""
    dim = tensor_shape(state, "cls_token", what, layout)[-1]
    patch = int(patch_size or tensor_shape(state, "patch_embed.proj.weight", what, layout)[-1])
    depth = len({int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))})
    if dim % num_heads:
        raise SSLCheckpointError(f"{what}: width {dim} is not divisible by num_heads={num_heads}; give the number "
                                 "of attention heads the ViT was trained with.")
    return DinoViT(patch_size=patch, dim=dim, depth=depth, num_heads=num_heads,
                   mlp_hidden=tensor_shape(state, "blocks.0.mlp.fc1.weight", what, layout)[0],
                   num_patches=tensor_shape(state, "pos_embed", what, layout)[1] - 1,
                   qkv_bias="blocks.0.attn.qkv.bias" in state)

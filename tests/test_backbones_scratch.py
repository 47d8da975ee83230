"""scratch:resnet18-cifar and scratch:vit-tiny: the paper's small backbones, randomly initialised from the seed."""

import pytest
import torch
from torch import nn

from headprobe.backbones import load_backbone


def test_resnet18_cifar_has_the_cifar_stem_and_512_features():
    bb = load_backbone("scratch:resnet18-cifar", pooling="mean")
    m = bb.model
    assert (m.conv1.kernel_size, m.conv1.stride) == ((3, 3), (1, 1)) and isinstance(m.maxpool, nn.Identity)
    # torchvision's ResNet-18 has 11,689,512 parameters: minus the 7x7 stem (9,408) and the 1000-way fc
    # (513,000), plus the 3x3 stem (1,728).
    assert bb.dim == 512 and len(bb.blocks) == 8 and bb.params == 11_689_512 - 9_408 - 513_000 + 1_728
    assert (bb.preprocess.resize, bb.preprocess.crop) == (32, 32)
    x = torch.randn(2, 3, 32, 32)
    fmap = m.layer4(m.layer3(m.layer2(m.layer1(m.relu(m.bn1(m.conv1(x)))))))
    assert fmap.shape == (2, 512, 4, 4)
    torch.testing.assert_close(bb(x), fmap.mean((2, 3)))
    both = load_backbone("scratch:resnet18-cifar", pooling="mean", layers=[1, -1])
    assert both.dim == 64 + 512 and both(x).shape == (2, 576)
    with pytest.raises(ValueError, match=r"is a CNN .* pooling 'cls' is undefined; supported poolings: mean\."):
        load_backbone("scratch:resnet18-cifar", pooling="cls")


def test_the_seed_alone_decides_the_weights():
    state = torch.random.get_rng_state()
    a = load_backbone("scratch:resnet18-cifar", pooling="mean", seed=7)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global random state is untouched
    torch.rand(5)
    b = load_backbone("scratch:resnet18-cifar", pooling="mean", seed=7)
    assert a.fingerprint == b.fingerprint != load_backbone("scratch:resnet18-cifar", pooling="mean").fingerprint
    assert a.options["seed"] == 7 and "seed 7" in a.description


def test_vit_tiny_matches_the_paper():
    bb = load_backbone("scratch:vit-tiny", pooling="cls+mean", layers=[0, -1])
    m = bb.model
    assert m.patch_embed.patch_size == (4, 4) and m.embed_dim == 192 and len(bb.blocks) == 3
    assert bb.blocks[0].attn.num_heads == 3 and bb.blocks[0].mlp.fc1.out_features == 768
    x = torch.randn(2, 3, 32, 32)
    tokens = m.forward_features(x)
    assert tokens.shape == (2, 1 + 64, 192)
    first = m.norm(m.blocks[0](m.norm_pre(m._pos_embed(m.patch_embed(x)))))
    expected = torch.cat([first[:, 0], first[:, 1:].mean(1), tokens[:, 0], tokens[:, 1:].mean(1)], 1)
    torch.testing.assert_close(bb(x), expected)
    assert bb.dim == 4 * 192
    wider = load_backbone("scratch:vit-tiny", resolution=48)
    assert wider(torch.randn(1, 3, 48, 48)).shape == (1, 192)
    with pytest.raises(ValueError, match="not a multiple of the patch size 4"):
        load_backbone("scratch:vit-tiny", resolution=30)


def test_unknown_scratch_name_suggests():
    with pytest.raises(ValueError, match="unknown scratch backbone 'vit-tiy'.*Did you mean 'vit-tiny'"):
        load_backbone("scratch:vit-tiy")

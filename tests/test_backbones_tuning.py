"""Tuning policies: each makes exactly its weights trainable, and one optimiser step moves only those."""

import pytest
import torch

from headprobe.backbones import apply_tuning, load_adapter, load_backbone, save_adapter


def _numel(modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def _step(bb, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """One SGD step towards random targets (not a norm of the features: layer norm makes those flat); returns
    the weights before it."""
    before = {n: p.detach().clone() for n, p in bb.model.named_parameters()}
    opt = torch.optim.SGD([p for p in bb.parameters() if p.requires_grad], lr=1.0)
    bb.train()
    target = torch.randn(x.shape[0], bb.dim, generator=torch.Generator().manual_seed(0))
    (bb(x) - target).pow(2).sum().backward()
    opt.step()
    bb.eval()
    return before


def _moved(bb, before) -> set[str]:
    return {n for n, p in bb.model.named_parameters() if not torch.equal(p, before[n])}


def test_last_blocks_and_final_norm_train_and_nothing_else():
    bb = load_backbone("scratch:vit-tiny")
    record = apply_tuning(bb, "last:1")
    tuned = {n for n, p in bb.model.named_parameters() if p.requires_grad}
    assert tuned == {n for n, _ in bb.model.named_parameters() if n.startswith(("blocks.2.", "norm."))}
    assert record["trainable"] == _numel([bb.blocks[-1], bb.model.norm]) == bb.trainable
    assert record["total"] == bb.params and record["policy"] == "last:1"
    fingerprint = bb.fingerprint
    before = _step(bb, torch.randn(4, 3, 32, 32))
    assert _moved(bb, before) == tuned
    assert bb.fingerprint != fingerprint  # a tuned backbone's fingerprint follows its weights
    assert bb.describe()["trainable"] == record["trainable"] and bb.describe()["tuning"]["policy"] == "last:1"


def test_full_trains_everything_and_frozen_nothing():
    bb = load_backbone("scratch:vit-tiny")
    assert apply_tuning(bb, "full")["trainable"] == bb.params
    before = _step(bb, torch.randn(4, 3, 32, 32))
    # Every weight, class token and position embedding included, gets a gradient and moves.
    assert _moved(bb, before) == set(before)
    frozen = load_backbone("scratch:vit-tiny")
    assert apply_tuning(frozen, "frozen")["trainable"] == 0 and not frozen.model.training


def test_frozen_batch_norm_statistics_stay_put_when_tuning_the_last_blocks():
    bb = load_backbone("scratch:resnet18-cifar", pooling="mean")
    apply_tuning(bb, "last:2")
    assert bb.trainable == _numel(bb.blocks[-2:])
    stats = {n: b.clone() for n, b in bb.model.named_buffers() if n.endswith("running_mean")}
    before = _step(bb, torch.randn(4, 3, 32, 32))
    changed = {n for n, b in bb.model.named_buffers() if n in stats and not torch.equal(b, stats[n])}
    assert changed and all(n.startswith("layer4.") for n in changed)  # only the tuned blocks' BN statistics
    assert all(n.startswith("layer4.") for n in _moved(bb, before))


def test_lora_adapts_attention_query_and_value_only(tiny_dinov2):
    bb = load_backbone(f"hf:{tiny_dinov2}")
    record = apply_tuning(bb, "lora", r=4, alpha=8)
    # transformers names them query/value (v4) or q_proj/v_proj (v5); 2 layers x (q, v).
    assert record["target_modules"] in (["query", "value"], ["q_proj", "v_proj"]) and record["n_adapted"] == 4
    # Each adapted 32->32 linear gains A (4x32) and B (32x4).
    assert record["trainable"] == bb.trainable == 4 * (4 * 32 + 32 * 4)
    assert record["total"] == load_backbone(f"hf:{tiny_dinov2}").params + record["trainable"]
    names = {n for n, p in bb.model.named_parameters() if p.requires_grad}
    assert all(".lora_A." in n or ".lora_B." in n for n in names)
    x = torch.randn(2, 3, 28, 28)
    plain = load_backbone(f"hf:{tiny_dinov2}")
    torch.testing.assert_close(bb(x), plain(x))  # B starts at zero: the adapted model starts as the original
    before = _step(bb, x)
    moved = _moved(bb, before)
    assert moved and moved <= names and all(".lora_B." in n for n in moved)  # A gets no gradient while B is 0


@pytest.mark.slow
def test_lora_adapters_save_and_load(tmp_path):
    bb = load_backbone("scratch:vit-tiny")
    apply_tuning(bb, "lora", seed=1)
    x = torch.randn(3, 3, 32, 32)
    _step(bb, x)
    _step(bb, x)
    save_adapter(bb, tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    fresh = load_adapter(load_backbone("scratch:vit-tiny"), tmp_path / "adapter")
    torch.testing.assert_close(fresh(x), bb(x))
    assert fresh.trainable == 0 and fresh.tuning["policy"] == "lora"
    assert not torch.allclose(fresh(x), load_backbone("scratch:vit-tiny")(x))
    with pytest.raises(ValueError, match="was trained on scratch:vit-tiny with weights .* but this backbone"):
        load_adapter(load_backbone("scratch:vit-tiny", seed=5), tmp_path / "adapter")


def test_policy_errors_are_sentences():
    bb = load_backbone("scratch:vit-tiny")
    with pytest.raises(ValueError, match="has 3 blocks, so N must be at most 3"):
        apply_tuning(bb, "last:4")
    with pytest.raises(ValueError, match="is not one of: frozen, last:N"):
        apply_tuning(bb, "last:0")
    with pytest.raises(ValueError, match="LoRA options .* are set but the tune policy is 'full'"):
        apply_tuning(bb, "full", r=4)
    apply_tuning(bb, "full")
    with pytest.raises(ValueError, match="already tuned"):
        apply_tuning(bb, "lora")

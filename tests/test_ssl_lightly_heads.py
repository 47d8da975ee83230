"""headprobe.ssl.lightly_heads against the installed lightly: every class of ``lightly.models.modules.heads`` is built
by lightly's own constructor (tiny widths), and its state dict is either rebuilt by headprobe, every tap equal to
lightly's own forward (hooks on its activation modules), or refused with a sentence naming it. A head whose
activation the layout does not fix is refused without a hint and rebuilt with one; never guessed."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from headprobe.ssl import SSLCheckpointError, load_pretrained_head
from headprobe.ssl.lightly_heads import ACTIVATION, candidates

heads = pytest.importorskip("lightly.models.modules.heads")

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"input_dim": 12, "hidden_dim": 10, "output_dim": 6, "bottleneck_dim": 5, "num_clusters": 7,
        "n_prototypes": 7}
# Constructor arguments that change a class's layout, each built too.
VARIANTS = {
    "MoCoProjectionHead": [{}, {"num_layers": 3, "batch_norm": True}],
    "SimCLRProjectionHead": [{}, {"num_layers": 3, "batch_norm": False}],
    "VICRegProjectionHead": [{}, {"num_layers": 2}, {"num_layers": 4}],
    "LeJEPAProjectionHead": [{}, {"num_layers": 2}],
    "LeWMProjectionHead": [{}, {"batch_norm": False}],
    "MMCRProjectionHead": [{}, {"batch_norm": False, "use_bias": True}, {"num_layers": 1}],
    "DINOProjectionHead": [{}, {"batch_norm": True}],
    "SMoGPrototypes": [{"group_features": torch.randn(3, 6, generator=torch.Generator().manual_seed(0)), "beta": 0.9}],
    "ProjectionHead": [{"blocks": [(12, 10, nn.BatchNorm1d(10), nn.GELU()), (10, 6, None, None)]}],
}
NAMES = {nn.ReLU: "relu", nn.GELU: "gelu"}


def head_classes() -> list[type]:
    return [c for c in vars(heads).values()
            if inspect.isclass(c) and issubclass(c, nn.Module) and c.__module__ == heads.__name__]


def built() -> list[tuple[str, dict]]:
    return [(c.__name__, extra) for c in head_classes() for extra in VARIANTS.get(c.__name__, [{}])]


def build(name: str, extra: dict) -> nn.Module:
    cls = getattr(heads, name)
    params = inspect.signature(cls.__init__).parameters
    torch.manual_seed(0)
    module = cls(**{k: v for k, v in TINY.items() if k in params and k not in extra}, **extra)
    with torch.no_grad():  # batch norms that are not the identity, as after training
        for m in module.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return module.eval()


def save(tmp_path, module: nn.Module, hparams: dict | None = None, beside: dict | None = None) -> str:
    """The head as lightly's examples hold it (``self.projection_head``), in a Lightning checkpoint's layout;
    `beside`: other modules of the LightningModule ({attribute: module})."""
    state = {"backbone.0.weight": torch.zeros(64, 3, 7, 7)}
    state |= {f"projection_head.{k}": v for k, v in module.state_dict().items()}
    for name, other in (beside or {}).items():
        state |= {f"{name}.{k}": v for k, v in other.state_dict().items()}
    path = tmp_path / "head.ckpt"
    torch.save({"epoch": 0, "state_dict": state, "hyper_parameters": hparams or {}}, path)
    return f"ssl:lightly:{path}"


def lightly_taps(module: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """lightly's own forward, with the output of each of its activation modules (hooks), then the head's output."""
    outs: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: outs.append(out)) for m in module.modules()
             if isinstance(m, tuple(NAMES))]
    with torch.no_grad():
        out = module(x)
    for h in hooks:
        h.remove()
    return [*outs, out]


def activation(module: nn.Module) -> str:
    return "+".join(dict.fromkeys(NAMES[type(m)] for m in module.modules() if isinstance(m, tuple(NAMES))))


def max_difference(head, module: nn.Module) -> float:
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(1))
    want = lightly_taps(module, x)
    with torch.no_grad():
        got = head.taps(x)
    assert len(got) == len(want) == head.depth
    return max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True))


def test_every_lightly_head_class_is_enumerated():
    names = {c.__name__ for c in head_classes()}
    assert names == {*ACTIVATION, "ProjectionHead", "DINOProjectionHead", "DINOv2ProjectionHead",
                     "CAPIProjectionHead", "SwaVPrototypes", "SMoGPrototypes"}


@pytest.mark.parametrize("name,extra", built(), ids=[f"{n}-{i}" for n, e in built() for i in [str(e)[:40]]])
def test_each_lightly_head_is_rebuilt_exactly_or_refused_by_name(tmp_path, name, extra):
    module = build(name, extra)
    id = save(tmp_path, module)
    if any(not k.startswith("layers.") for k in module.state_dict()):
        with pytest.raises(SSLCheckpointError, match=rf"outside a lightly ProjectionHead's layers.*{name}"):
            load_pretrained_head(id)
        return
    act = activation(module)
    if name in ACTIVATION:
        assert ACTIVATION[name] == act  # headprobe's table says what lightly's constructor builds
    try:
        head = load_pretrained_head(id)
    except SSLCheckpointError as err:  # the layout does not fix the activation: the candidates and the hint named
        message = str(err)
        assert name in message or name == "ProjectionHead"
        assert "act: relu or act: gelu" in message and "does not guess" in message
    else:
        assert head.record.head_rebuilt["from"].startswith("the layout") and head.activation == act
        assert max_difference(head, module) <= 1e-6
    head = load_pretrained_head(id, act=act)
    assert head.activation == act and head.record.head_rebuilt["from"].startswith("the act given")
    assert max_difference(head, module) <= 1e-6
    if name in ACTIVATION:
        assert name in head.record.head_rebuilt["class_candidates"]


@pytest.mark.parametrize("name,twin", [("MSNProjectionHead", "BarlowTwinsProjectionHead"),
                                       ("LeWMProjectionHead", "BYOLProjectionHead")])
def test_gelu_heads_with_a_relu_twin_are_refused_without_a_hint(tmp_path, name, twin):
    module = build(name, {})
    id = save(tmp_path, module)
    with pytest.raises(SSLCheckpointError, match=rf"{twin}.*\(relu\) or .*{name}.* \(gelu\).*act: relu or act: gelu"):
        load_pretrained_head(id)
    relu = load_pretrained_head(id, act="relu")  # what the old loader built silently: measurably not lightly's head
    assert max_difference(relu, module) > 1e-2
    assert max_difference(load_pretrained_head(id, act="gelu"), module) <= 1e-6


def test_hyper_parameters_naming_the_class_say_the_activation(tmp_path):
    module = build("MSNProjectionHead", {})
    head = load_pretrained_head(save(tmp_path, module, {"projection_head": "MSNProjectionHead", "lr": 0.1}))
    assert head.activation == "gelu" and max_difference(head, module) <= 1e-6
    assert head.record.head_rebuilt["from"] == "hyper_parameters name MSNProjectionHead"
    assert head.record.args == {"projection_head": "MSNProjectionHead", "lr": 0.1}
    # The head module itself among the hyper-parameters: read as an inert placeholder, never rebuilt, named.
    head = load_pretrained_head(save(tmp_path, module, {"projection_head": build("MSNProjectionHead", {})}))
    assert head.record.head_rebuilt["from"] == "hyper_parameters name MSNProjectionHead"
    assert "lightly.models.modules.heads.MSNProjectionHead" in head.record.skipped


def test_a_hint_outside_the_activations_or_against_a_fixed_head_is_refused(tmp_path):
    id = save(tmp_path, build("SimSiamProjectionHead", {}))
    with pytest.raises(SSLCheckpointError, match="act 'none' is not an activation a lightly head is rebuilt with"):
        load_pretrained_head(id, act="none")
    assert candidates("L+BN+A L+BN+A L+BNp") == ["SimSiamProjectionHead"]


def test_swav_and_smog_prototypes_beside_the_head_are_ignored(tmp_path):
    """lightly's SwaV example keeps `self.prototypes = SwaVPrototypes(...)`, SMoG's `self.smog = SMoGPrototypes()`."""
    module = build("SwaVProjectionHead", {})
    beside = {"prototypes": build("SwaVPrototypes", {}), "smog": build("SMoGPrototypes", VARIANTS["SMoGPrototypes"][0])}
    head = load_pretrained_head(save(tmp_path, module, beside=beside), act="relu")
    assert max_difference(head, module) <= 1e-6
    assert {"prototypes.*", "smog.*"} <= set(head.record.ignored)


def test_a_custom_projection_head_is_rebuilt_with_the_activation_given(tmp_path):
    module = build("ProjectionHead", {"blocks": [(12, 10, None, nn.SiLU()), (10, 6, None, None)]})
    head = load_pretrained_head(save(tmp_path, module), act="silu")
    x = torch.randn(3, 12, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(head(x), module(x), rtol=0, atol=1e-6)
    assert isinstance(head[1], nn.SiLU) and head.activation == "swish"


def test_a_head_without_an_activation_needs_no_hint(tmp_path):
    module = build("ProjectionHead", {"blocks": [(12, 6, nn.BatchNorm1d(6), None)]})
    head = load_pretrained_head(save(tmp_path, module))
    assert head.depth == 1 and head.record.head_rebuilt["from"] == "the layout: it has no activation"
    assert max_difference(head, module) <= 1e-6

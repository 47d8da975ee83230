"""headprobe.ssl with files lightly and Lightning write themselves: LightningModules built as lightly's examples
build them (a torchvision ResNet's children as ``backbone``, lightly's head classes, BYOL's momentum copies and
prediction head, lightly's losses and LARS, a cosine schedule, a ModelCheckpoint callback, saved hyper-parameters),
trained two steps by a real ``pytorch_lightning.Trainer`` and saved with ``trainer.save_checkpoint``. The backbone's
features and every head tap are compared with the trained modules' own forward."""

from __future__ import annotations

import copy

import pytest
import torch
from test_ssl_lightly_heads import lightly_taps
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

from headprobe.backbones import load_backbone
from headprobe.ssl import SSLCheckpointError, load_pretrained_head

pl = pytest.importorskip("pytorch_lightning")
heads = pytest.importorskip("lightly.models.modules.heads")
losses = pytest.importorskip("lightly.loss")

pytestmark = [pytest.mark.usefixtures("single_thread"), pytest.mark.slow]  # a real Trainer, two steps each

HIDDEN, OUT = 16, 8


class Example(pl.LightningModule):
    """lightly's examples/pytorch_lightning/<method>.py, narrowed: `head` names the projection head class."""

    def __init__(self, head: str = "BarlowTwinsProjectionHead", momentum: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(*list(ResNet(BasicBlock, [1, 1, 1, 1]).children())[:-1])
        self.projection_head = getattr(heads, head)(512, HIDDEN, OUT)
        if momentum:  # BYOL: momentum copies and a prediction head
            self.prediction_head = heads.BYOLPredictionHead(OUT, HIDDEN, OUT)
            self.backbone_momentum = copy.deepcopy(self.backbone)
            self.projection_head_momentum = copy.deepcopy(self.projection_head)
        self.criterion = losses.NegativeCosineSimilarity() if momentum else losses.BarlowTwinsLoss()

    def embed(self, x: torch.Tensor, momentum: bool = False) -> torch.Tensor:
        if momentum:
            return self.projection_head_momentum(self.backbone_momentum(x).flatten(1))
        return self.projection_head(self.backbone(x).flatten(1))

    def training_step(self, batch, _):
        x = batch[0]
        x0, x1 = x, x.flip(-1) + 0.1 * torch.randn_like(x)
        if self.hparams.momentum:
            with torch.no_grad():
                for online, ema in ((self.backbone, self.backbone_momentum),
                                    (self.projection_head, self.projection_head_momentum)):
                    for p, q in zip(online.parameters(), ema.parameters(), strict=True):
                        q.mul_(0.9).add_(0.1 * p)
            p0 = self.prediction_head(self.embed(x0))
            return self.criterion(p0, self.embed(x1, momentum=True).detach())
        return self.criterion(self.embed(x0), self.embed(x1))

    def configure_optimizers(self):
        from lightly.utils.lars import LARS

        opt = LARS(self.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)]


def train_and_save(tmp_path, **kw) -> tuple[Example, str]:
    module = Example(**kw)
    images = torch.utils.data.TensorDataset(torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(1)))
    trainer = pl.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "checkpoints")])
    trainer.fit(module, torch.utils.data.DataLoader(images, batch_size=4))
    path = tmp_path / "final.ckpt"
    trainer.save_checkpoint(path)
    return module.eval(), f"ssl:lightly:{path}"


def max_head_difference(head, lightly_head: nn.Module) -> float:
    feats = torch.randn(6, 512, generator=torch.Generator().manual_seed(2))
    want = lightly_taps(lightly_head.eval(), feats)
    with torch.no_grad():
        got = head.taps(feats)
    assert len(got) == len(want) == head.depth
    return max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True))


def max_backbone_difference(id: str, backbone: nn.Module, part: str | None = None) -> float:
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return float((load_backbone(id, part=part)(x) - backbone.eval()(x).flatten(1)).abs().max())


@pytest.mark.parametrize("head", ["SimCLRProjectionHead", "BarlowTwinsProjectionHead", "MSNProjectionHead",
                                  "LeWMProjectionHead"])
def test_trained_and_saved_by_lightning(tmp_path, head):
    module, id = train_and_save(tmp_path, head=head)
    assert max_backbone_difference(id, module.backbone) <= 1e-5
    # The saved hyper-parameters name the head class, so even the GELU heads with a ReLU twin are read exactly.
    own = load_pretrained_head(id)
    assert own.record.head_rebuilt["from"] == f"hyper_parameters name {head}"
    assert max_head_difference(own, module.projection_head) <= 1e-6
    record = own.record.to_dict()
    assert record["args"] == {"head": head, "momentum": False}
    assert record["skipped_objects"] == {}  # LARS, the schedule and the callback save plain values only
    assert {"optimizer_states", "lr_schedulers", "callbacks", "hyper_parameters"} <= set(record["ignored_entries"])


def test_byol_teacher_and_student_without_hyper_parameters_need_act(tmp_path):
    module, id = train_and_save(tmp_path, head="BYOLProjectionHead", momentum=True)
    path = id.removeprefix("ssl:lightly:")
    ckpt = torch.load(path, weights_only=True)
    del ckpt["hyper_parameters"]  # a module that did not call save_hyperparameters()
    torch.save(ckpt, path)
    with pytest.raises(SSLCheckpointError, match=r"BYOLProjectionHead.*\(relu\) or LeWMProjectionHead \(gelu\)"):
        load_pretrained_head(id)
    for part, backbone, projection in (("student", module.backbone, module.projection_head),
                                       ("teacher", module.backbone_momentum, module.projection_head_momentum)):
        assert max_backbone_difference(id, backbone, part) <= 1e-5
        own = load_pretrained_head(id, part=part, act="relu")
        assert max_head_difference(own, projection) <= 1e-6
        assert "prediction_head.*" in own.record.ignored

"""A head type registered from outside the package is built through the HEADS registry and runs end to end (#29)."""

import pytest
import torch
from torch import nn

from headprobe import run
from headprobe.registry import HEADS


class CosineHead(nn.Module):
    """A toy head: one bias-free linear map followed by L2 normalisation; two taps (`depth` 2)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim, bias=False)
        self.out_dim, self.depth = out_dim, 2

    def taps(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.linear(x)
        return [h, nn.functional.normalize(h, dim=-1)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.taps(x)[-1]


def cosine_head(in_dim: int, spec) -> CosineHead:
    return CosineHead(in_dim, spec.width)


@pytest.fixture
def registered():
    HEADS.add("cosine", f"{__name__}:cosine_head", "a linear map then L2 normalisation (a test plug-in)")
    yield
    HEADS.remove("cosine")


@pytest.mark.slow
def test_a_head_type_registered_from_outside_runs_through_a_recipe(tiny_recipe, tmp_path, registered):
    recipe = {**tiny_recipe, "heads": [{"name": "cos", "type": "cosine", "width": 8}],
              "train": {"epochs": 2, "batch_size": 50}, "augment": {"preset": "crop-flip", "views": 2}, "report": False}
    results = run(recipe, out=tmp_path / "r", quiet=True)
    assert {"cos@1", "cos"} <= set(results["taps"])
    assert results["heads"]["cos"]["train"]["steps"] > 0
    assert 0.0 <= results["taps"]["cos"]["metrics"]["linear.acc"] <= 1.0

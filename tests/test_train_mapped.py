"""Head training on a memory-mapped view cache: bitwise the training on the same views loaded in memory, its
batches read row by row from the file (`tensor_file.gather_rows`)."""

import pytest
import torch

import headprobe.train.cached_views as train_module
from headprobe.features.cache import load_cached, save_cached
from headprobe.features.tensor_file import gather_rows, is_mapped
from headprobe.recipe import GeometrySpec, HeadSpec, TrainSpec
from headprobe.train.cached_views import train_heads

pytestmark = pytest.mark.usefixtures("single_thread")

HEADS = [HeadSpec(name="relu", act="relu", width=16, out_dim=8), HeadSpec(name="lin", type="linear", width=8)]
TRAIN = TrainSpec(epochs=2, batch_size=16, lr=1e-2, log_every=2)
# Tracking uses the mean view feature (for the collapsed start) and the first views: both read the mapping too.
TRACK = GeometrySpec(track_every=3, track_rows=4, track_max_iter=8, collapse_offset=1.0)


def _train(views):
    return train_heads(HEADS, views, objective_name="vicreg", objective_options={}, train=TRAIN, seed=0, track=TRACK)


@pytest.mark.filterwarnings("ignore:head 'lin' does not start collapsed")  # a linear head cannot be collapsed
def test_a_mapped_view_cache_trains_bitwise_like_the_loaded_one(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(0)
    views = torch.randn(48, 1, 12, generator=g) + 0.3 * torch.randn(48, 4, 12, generator=g)
    path = tmp_path / "views.safetensors"
    assert save_cached(path, "key", {}, views, torch.zeros(48, 4, 3), second="params")
    mapped, _ = load_cached(path, "key", 48, mapped=True)
    assert is_mapped(mapped)
    gathered = []

    def counting(tensor, *index):
        gathered.append(is_mapped(tensor))
        return gather_rows(tensor, *index)

    monkeypatch.setattr(train_module, "gather_rows", counting)
    loaded_states, loaded_summary = _train(views)
    mapped_states, mapped_summary = _train(mapped)
    assert gathered.count(True) == gathered.count(False) == 1 + 2 * 6  # the first views, then 2 per step
    assert mapped_summary["collapse_start"] == loaded_summary["collapse_start"]
    for name in ("relu", "lin"):
        assert [r["loss"] for r in mapped_states[name].history if "loss" in r] == \
            [r["loss"] for r in loaded_states[name].history if "loss" in r]
        for key, value in loaded_states[name].head.state_dict().items():
            assert torch.equal(mapped_states[name].head.state_dict()[key], value), (name, key)

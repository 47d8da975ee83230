"""Orbit features: equal to a plain forward of the sweep's frames, cached under a key that changes with everything
that changes them, and a corrupt or mismatched file recomputed."""

import dataclasses

import pytest
import torch

from headprobe.backbones import load_backbone
from headprobe.data import load_data
from headprobe.data.cache_dir import cache_root
from headprobe.data.orbits import ORBIT_SWEEPS, orbit_images
from headprobe.features.orbits import extract_orbits, orbit_key
from headprobe.features.views import normalise_only
from headprobe.recipe import DataSpec, LimitSpec


@pytest.fixture
def setup(tiny_dinov2):
    return load_backbone(f"hf:{tiny_dinov2}"), load_data(DataSpec(limit=LimitSpec(train=20, test=10)))


def _orbits(bb, data, sweeps=("rotation45", "blur"), n_images=5, record=None, **kw):
    return extract_orbits(bb, data.test, sweeps=list(sweeps), n_images=n_images, data_info=data.info, batch_size=7,
                          record=record, **kw)


def _plain(bb, data, sweep, n_images):
    """The sweep's frames of the first images, made from the checkpoint's own processor's pixels before
    normalisation (transformers' AutoImageProcessor), and forwarded one image at a time."""
    from torchvision.transforms.v2.functional import to_pil_image
    from transformers import AutoImageProcessor

    processor, normalise = AutoImageProcessor.from_pretrained(bb.id.removeprefix("hf:")), normalise_only(bb.preprocess)
    rows = []
    for i in range(n_images):
        pixels = processor(data.test[i]["image"], do_rescale=False, do_normalize=False, return_tensors="pt")
        frames = torch.stack([normalise(frame) for frame in orbit_images(to_pil_image(pixels.pixel_values[0]), sweep)])
        with torch.no_grad():
            rows.append(bb(frames))
    return torch.stack(rows)


def test_orbits_equal_a_plain_forward_and_are_cached(setup):
    bb, data = setup
    record = {}
    first = _orbits(bb, data, record=record)
    assert {s: t.shape for s, t in first.items()} == {"rotation45": (5, 10, bb.dim), "blur": (5, 7, bb.dim)}
    for sweep in first:
        torch.testing.assert_close(first[sweep], _plain(bb, data, sweep, 5), atol=1e-5, rtol=1e-5)
    assert record["orbits-rotation45"]["hit"] is False and record["orbits-blur"]["hit"] is False
    files = sorted((cache_root() / "orbits").glob("*.safetensors"))
    assert [f.stem for f in files] == sorted(record[f"orbits-{s}"]["key"] for s in first)
    again = {}
    second = _orbits(bb, data, record=again)
    assert again == {k: {"key": v["key"], "hit": True} for k, v in record.items()}
    for sweep in first:
        assert torch.equal(second[sweep], first[sweep])


def test_key_changes_with_everything_that_changes_the_orbits(setup, tiny_dinov2):
    bb, data = setup
    base = orbit_key(bb, data.info, "blur", 5, "fp32")[0]
    assert orbit_key(bb, data.info, "rotation45", 5, "fp32")[0] != base
    assert orbit_key(bb, data.info, "blur", 6, "fp32")[0] != base
    assert orbit_key(bb, data.info, "blur", 5, "bf16")[0] != base
    assert orbit_key(load_backbone(f"hf:{tiny_dinov2}", resolution=42), data.info, "blur", 5, "fp32")[0] != base
    other = load_data(DataSpec(limit=LimitSpec(train=20, test=12)))
    assert orbit_key(bb, other.info, "blur", 5, "fp32")[0] != base
    # A changed sweep definition (here: more blur) is a different key, so an old file is never read for it.
    import headprobe.data.orbits as orbit_definitions

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(orbit_definitions, "BLUR", dataclasses.replace(ORBIT_SWEEPS["blur"], high=4.0))
        assert orbit_key(bb, data.info, "blur", 5, "fp32")[0] != base


def test_a_corrupt_file_is_recomputed_and_no_data_info_caches_nothing(setup):
    bb, data = setup
    record = {}
    first = _orbits(bb, data, sweeps=["blur"], record=record)
    path = cache_root() / "orbits" / f"{record['orbits-blur']['key']}.safetensors"
    path.chmod(0o644)  # cache files are read-only (root writes them anyway)
    path.write_bytes(path.read_bytes()[:-8] + b"\x00" * 8)  # the last feature bytes overwritten
    with pytest.warns(UserWarning, match="unusable"):
        again = _orbits(bb, data, sweeps=["blur"], record=record)
    assert record["orbits-blur"]["hit"] is False and torch.equal(again["blur"], first["blur"])
    path.unlink()
    extract_orbits(bb, data.test, sweeps=["blur"], n_images=5)  # no data_info: no key to file it under
    assert not path.exists()


def test_more_images_than_the_split_holds_takes_them_all(setup):
    bb, data = setup
    assert _orbits(bb, data, sweeps=["rotation45"], n_images=50)["rotation45"].shape[0] == len(data.test)


def test_orbits_follow_the_runs_effective_precision(setup):
    """bf16 asks for autocast on a GPU only (`features.effective_precision`): on the CPU it is the fp32 extraction,
    under the fp32 key, so the file an fp32 run wrote is a hit."""
    bb, data = setup
    fp32, bf16 = {}, {}
    first = _orbits(bb, data, sweeps=["blur"], record=fp32)
    again = _orbits(bb, data, sweeps=["blur"], record=bf16, precision="bf16")
    assert bf16 == {"orbits-blur": {"key": fp32["orbits-blur"]["key"], "hit": True}}
    assert torch.equal(again["blur"], first["blur"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_orbits_on_cuda_are_close_to_fp32_and_cached_apart(setup):
    bb, data = setup
    fp32, bf16 = {}, {}
    exact = _orbits(bb, data, sweeps=["rotation45"], record=fp32)["rotation45"]
    low = _orbits(bb, data, sweeps=["rotation45"], record=bf16, precision="bf16")["rotation45"]
    assert fp32["orbits-rotation45"]["key"] != bf16["orbits-rotation45"]["key"]
    assert low.device.type == "cpu" and low.dtype == torch.float32
    assert float((low - exact).norm() / exact.norm()) < 0.05  # bf16 keeps ~3 significant digits per activation

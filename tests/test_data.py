from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from headprobe.data.sources import DataSourceError, load_data
from headprobe.recipe import DataSpec, LimitSpec


def test_sklearn_digits_split_is_stratified_and_seeded():
    data = load_data(DataSpec(test_fraction=0.25))
    assert (data.info["n_train"], data.info["n_test"], data.n_classes) == (1347, 450, 10)
    test_counts = np.bincount(data.test["label"], minlength=10)
    all_counts = test_counts + np.bincount(data.train["label"], minlength=10)
    assert np.abs(test_counts - 0.25 * all_counts).max() <= 1  # stratified: a quarter of each digit
    img = data.train[0]["image"]
    assert isinstance(img, Image.Image) and img.size == (8, 8) and max(img.getdata()) <= 255
    again = load_data(DataSpec(test_fraction=0.25))
    assert again.train["label"] == data.train["label"] and again.fingerprint == data.fingerprint
    other = load_data(DataSpec(test_fraction=0.25, split_seed=1))
    assert other.train["label"] != data.train["label"]


def test_limits_are_stratified_subsets():
    data = load_data(DataSpec(limit=LimitSpec(train=100, test=30)))
    assert (len(data.train), len(data.test)) == (100, 30)
    assert np.bincount(data.train["label"], minlength=10).min() >= 9


def _folder(root, splits=("train", "test"), per_class=4):
    rng = np.random.default_rng(0)
    for split in splits:
        for cls in ("cat", "dog", "owl"):
            d = root / split / cls if split else root / cls
            d.mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)).save(d / f"{i}.png")


def test_imagefolder_with_splits(tmp_path):
    _folder(tmp_path)
    data = load_data(DataSpec(source=f"imagefolder:{tmp_path}"))
    assert data.class_names == ["cat", "dog", "owl"]
    assert (len(data.train), len(data.test)) == (12, 12)
    assert data.info["test_split"] == "the source's 'test' split"


def test_imagefolder_without_test_split_and_fingerprint_tracks_files(tmp_path):
    _folder(tmp_path, splits=("",), per_class=8)
    spec = DataSpec(source=f"imagefolder:{tmp_path}", test_fraction=0.25)
    data = load_data(spec)
    assert (len(data.train), len(data.test)) == (18, 6)
    Image.new("RGB", (10, 12)).save(tmp_path / "cat" / "extra.png")
    assert load_data(spec).fingerprint != data.fingerprint


@pytest.mark.slow
def test_bad_columns_splits_and_paths_are_explained(tmp_path):
    with pytest.raises(DataSourceError, match="data.label_column = 'target' is not a column.*image, label"):
        load_data(DataSpec(label_column="target"))
    with pytest.raises(DataSourceError, match="data.train_split = 'training' is not a split"):
        load_data(DataSpec(train_split="training"))
    with pytest.raises(DataSourceError, match="is not a directory"):
        load_data(DataSpec(source=f"imagefolder:{tmp_path / 'missing'}"))
    with pytest.raises(DataSourceError, match="could not be loaded from the local cache or the hub"):
        load_data(DataSpec(source="hf:no-such-org/no-such-dataset"))


def _write_idx(path, array):
    import gzip

    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.mark.slow
def test_fashion_mnist_reads_idx_files(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 30), ("t10k", 20)):
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 255, (n, 28, 28)))
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    data = load_data(DataSpec(source=f"fashion-mnist:{tmp_path}"))
    assert (len(data.train), len(data.test), data.class_names[9]) == (30, 20, "Ankle boot")
    assert np.array_equal(np.asarray(data.train[3]["image"]), _read(tmp_path)[3])
    assert data.train["label"][:12] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    with pytest.raises(DataSourceError, match="apt-get install dataset-fashion-mnist"):
        load_data(DataSpec(source=f"fashion-mnist:{tmp_path / 'empty'}"))


def _read(root):
    from headprobe.data.sources import _read_idx

    return _read_idx(root / "train-images-idx3-ubyte.gz")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(),
                    reason="needs Debian's files: apt-get install dataset-fashion-mnist")
def test_debian_fashion_mnist():
    data = load_data(DataSpec(source="fashion-mnist", limit=LimitSpec(train=100, test=50)))
    assert data.info["n_classes"] == 10 and len(data.train) == 100
    assert data.train[0]["image"].size == (28, 28)

"""`headprobe validate` checks that the recipe's data is on this machine (headprobe/data/sources.py `missing_data`):
the Fashion-MNIST IDX files (Debian's `dataset-fashion-mnist`, or a folder given as fashion-mnist:<dir>), an
imagefolder's directory, a local save_to_disk folder; a missing one is refused with the line that installs it."""

from __future__ import annotations

import pytest

from headprobe.cli import main
from headprobe.data.sources import FASHION_MNIST_DIR, missing_data

FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
         "t10k-labels-idx1-ubyte.gz")


@pytest.fixture(autouse=True)
def _no_hub_cache(tmp_path, monkeypatch):
    """No cached hub copy of Fashion-MNIST (the loader's fallback) in the Hugging Face caches."""
    for name in ("HF_HOME", "HF_DATASETS_CACHE", "HF_HUB_CACHE"):
        monkeypatch.setenv(name, str(tmp_path / "hf-cache" / name))


def _validate(source: str, capsys) -> tuple[int, str]:
    code = main(["validate", "recipes/quickstart.yaml", "--set", f"data.source={source}"])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def test_fashion_mnist_files_in_the_folder_given_pass(tmp_path, capsys):
    fake = tmp_path / "fmnist"
    fake.mkdir()
    for name in FILES:
        (fake / name).write_bytes(b"")
    code, said = _validate(f"fashion-mnist:{fake}", capsys)
    assert code == 0 and said.startswith("ok recipes/quickstart.yaml")


def test_missing_fashion_mnist_is_refused_with_the_install_line(tmp_path, capsys):
    fake = tmp_path / "partial"
    fake.mkdir()
    (fake / FILES[0]).write_bytes(b"")  # one file of four
    code, said = _validate(f"fashion-mnist:{fake}", capsys)
    assert code == 2 and "Traceback" not in said
    assert f"{', '.join(FILES[1:])} not in {fake}" in said and "`apt-get install dataset-fashion-mnist`" in said
    assert str(FASHION_MNIST_DIR) in said  # where the package puts them


def test_a_cached_hub_copy_is_the_loaders_fallback_and_passes(tmp_path, monkeypatch):
    (tmp_path / "hub" / "datasets--zalando-datasets--fashion_mnist").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert missing_data(f"fashion-mnist:{tmp_path / 'none'}") is None


def test_an_imagefolder_or_saved_folder_that_is_not_there_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, said = _validate(f"imagefolder:{tmp_path / 'empty'}", capsys)
    assert code == 2 and f"{tmp_path / 'empty'} holds no files" in said
    code, said = _validate(f"imagefolder:{tmp_path / 'gone'}", capsys)
    assert code == 2 and f"{tmp_path / 'gone'} is not a directory" in said
    code, said = _validate(f"hf:{tmp_path / 'saved'}", capsys)
    assert code == 2 and f"{tmp_path / 'saved'} does not exist" in said
    assert missing_data("sklearn-digits") is None and missing_data("hf:uoft-cs/cifar10") is None

"""`hf:` data offline: save_to_disk folders (Dataset and DatasetDict), config names, revisions and streaming, on tiny
datasets written here."""

import numpy as np
import pytest

from headprobe.data import load_data
from headprobe.data.hub import first_examples, read_streamed
from headprobe.data.sources import DataSourceError
from headprobe.recipe import DataSpec, LimitSpec, RecipeError, load_recipe


def _images(n: int, offset: int = 0, classes: int = 2):
    """`datasets.Dataset` of n 8×8 grey images whose pixels all equal their index (+offset), labels i % classes."""
    import datasets
    from PIL import Image

    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=[f"c{i}" for i in range(classes)])})
    return datasets.Dataset.from_dict(
        {"image": [Image.fromarray(np.full((8, 8), i + offset, np.uint8)) for i in range(n)],
         "label": [i % classes for i in range(n)]}, features=features)


def _pixel(ds, i: int) -> int:
    return int(np.asarray(ds[i]["image"])[0, 0])


def test_a_saved_dataset_and_a_saved_dataset_dict_load(tmp_path):
    import datasets

    _images(40).save_to_disk(str(tmp_path / "one"))
    data = load_data(DataSpec(source=f"hf:{tmp_path / 'one'}", test_fraction=0.25))
    assert (data.info["n_train"], data.info["n_test"], data.class_names) == (30, 10, ["c0", "c1"])
    pixels = sorted(_pixel(data.train, i) for i in range(30)) + sorted(_pixel(data.test, i) for i in range(10))
    assert sorted(pixels) == list(range(40))  # every saved image, once
    assert load_data(DataSpec(source=f"hf:{tmp_path / 'one'}")).fingerprint == data.fingerprint

    datasets.DatasetDict({"train": _images(20), "test": _images(6, offset=100)}).save_to_disk(str(tmp_path / "two"))
    data = load_data(DataSpec(source=f"hf:{tmp_path / 'two'}", limit=LimitSpec(train=10)))
    assert data.info["n_train"] == 10 and [_pixel(data.test, i) for i in range(6)] == list(range(100, 106))
    assert "the source's 'test' split" in data.info["test_split"]
    with pytest.raises(DataSourceError, match="written by DatasetDict.save_to_disk, which has no configurations"):
        load_data(DataSpec(source=f"hf:{tmp_path / 'two'}", config="small"))
    with pytest.raises(DataSourceError, match="which has no revisions"):
        load_data(DataSpec(source=f"hf:{tmp_path / 'one'}", revision="main"))


def _configured_folder(root):
    """A local dataset folder with two configurations ("small": 12 images, "large": 30), each with train/test
    parquet files, declared in README.md as the hub does."""
    for name, n in (("small", 12), ("large", 30)):
        (root / name).mkdir(parents=True)
        _images(n).to_parquet(str(root / name / "train.parquet"))
        _images(n // 3, offset=200).to_parquet(str(root / name / "test.parquet"))
    (root / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: small\n  data_files:\n  - {split: train, path: small/train.parquet}\n"
        "  - {split: test, path: small/test.parquet}\n"
        "- config_name: large\n  default: true\n  data_files:\n  - {split: train, path: large/train.parquet}\n"
        "  - {split: test, path: large/test.parquet}\n---\n")
    return root


def test_a_config_name_picks_the_configuration(tmp_path):
    root = _configured_folder(tmp_path / "folder")
    small = load_data(DataSpec(source=f"hf:{root}", config="small"))
    default = load_data(DataSpec(source=f"hf:{root}"))
    assert (small.info["n_train"], small.info["n_test"], small.info["config"]) == (12, 4, "small")
    assert (default.info["n_train"], default.info["n_test"]) == (30, 10) and "config" not in default.info
    assert small.fingerprint != default.fingerprint
    with pytest.raises(DataSourceError, match="data.config = 'medium' is not a configuration of hf:"):
        load_data(DataSpec(source=f"hf:{root}", config="medium"))


def test_the_revision_reaches_datasets_and_the_fingerprint(tmp_path, monkeypatch):
    import datasets

    root = _configured_folder(tmp_path / "folder")
    calls = []
    real = datasets.load_dataset

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **{**kwargs, "revision": None})  # a local folder has no revisions to check out

    monkeypatch.setattr(datasets, "load_dataset", spy)
    pinned = load_data(DataSpec(source=f"hf:{root}", revision="v1.0"))
    other = load_data(DataSpec(source=f"hf:{root}", revision="v2.0"))
    assert [c["revision"] for c in calls] == ["v1.0", "v2.0"] and pinned.info["revision"] == "v1.0"
    assert pinned.fingerprint != other.fingerprint  # another revision never reuses a feature cache


def test_streaming_reads_only_the_first_examples(tmp_path):
    root = _configured_folder(tmp_path / "folder")
    spec = DataSpec(source=f"hf:{root}", streaming=True, limit=LimitSpec(train=7, test=3))
    data = load_data(spec)
    assert (data.info["n_train"], data.info["n_test"], data.info["streaming"]) == (7, 3, True)
    assert [_pixel(data.train, i) for i in range(7)] == list(range(7))  # the first 7 of the stream, in order
    assert [_pixel(data.test, i) for i in range(3)] == [200, 201, 202]
    assert load_data(spec).fingerprint == data.fingerprint
    _images(30, offset=50).to_parquet(str(root / "large" / "train.parquet"))  # other images, same names
    assert load_data(spec).fingerprint != data.fingerprint  # keyed by what was read


def test_streaming_stops_after_the_limit():
    import datasets

    produced = []

    def examples(n):
        for i in range(n):
            produced.append(i)
            yield {"image": None, "label": i % 2}

    stream = datasets.IterableDataset.from_generator(examples, gen_kwargs={"n": 10_000})
    kept = first_examples(stream, 5)
    assert len(kept) == 5 and len(produced) <= 6  # 10,000 examples exist; at most one past the limit was read
    produced.clear()
    spec = DataSpec(source="hf:x", streaming=True, limit=LimitSpec(train=4, test=2))
    ds, _ = read_streamed(datasets.IterableDatasetDict({"train": stream}), spec, identity=("x",))
    assert len(ds["train"]) == 6 and len(produced) <= 7  # no test split: train's first limit.train + limit.test
    with pytest.raises(DataSourceError, match="data.train_split = 'fit' is not a split of hf:x; its splits are: "
                                              "train"):
        read_streamed(datasets.IterableDatasetDict({"train": stream}), DataSpec(
            source="hf:x", train_split="fit", streaming=True, limit=LimitSpec(train=4, test=2)), identity=("x",))


def test_the_recipe_refuses_what_the_source_cannot_do():
    with pytest.raises(RecipeError, match="set both"):
        load_recipe({"data": {"source": "hf:user/set", "streaming": True, "limit": {"train": 100}}})
    with pytest.raises(RecipeError, match="data.config = 'x' applies to hf: sources"):
        load_recipe({"data": {"source": "sklearn-digits", "config": "x"}})
    with pytest.raises(RecipeError, match="data.streaming = True applies to hf: sources"):
        load_recipe({"data": {"source": "imagefolder:/tmp", "streaming": True, "limit": {"train": 10, "test": 5}}})
    assert load_recipe({"data": {"source": "fashion-mnist", "revision": "main"}}).data.revision == "main"


def test_a_missing_hub_dataset_says_what_works_offline():
    with pytest.raises(DataSourceError, match="save it with save_to_disk and use data.source hf:<that folder>"):
        load_data(DataSpec(source="hf:nobody/no-such-dataset-31b"))

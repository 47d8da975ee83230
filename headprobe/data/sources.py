"""Data sources through Hugging Face `datasets`: built-ins, local image folders, hub ids.

Every source returns a `datasets.DatasetDict` plus a content fingerprint; `load_data`
then picks the image and label columns, makes a stratified test split when the
source has none, and applies per-split limits (stratified, seeded).
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..registry import DATA_SOURCES, split_prefixed
from .errors import DataSourceError

if TYPE_CHECKING:  # numpy loads when data does, not when `validate` checks a data source is there
    import numpy as np


@dataclass
class DataSplits:
    """`train`/`test` are `datasets.Dataset`s with columns ``image`` (PIL) and ``label`` (int)."""

    train: object
    test: object
    class_names: list[str]
    fingerprint: str
    info: dict = field(default_factory=dict)

    @property
    def n_classes(self) -> int:
        return len(self.class_names)


def _sha(*parts: object) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else repr(part).encode())
    return h.hexdigest()[:16]


def load_sklearn_digits(ref: str = "", revision: str | None = None):
    """scikit-learn's 1,797 8×8 digits as grey PIL images (0–16 ink scaled to 0–255)."""
    import datasets
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(i) for i in range(10)])}
    )
    ds = datasets.Dataset.from_dict(
        {"image": [Image.fromarray(p, mode="L") for p in pixels], "label": digits.target.tolist()},
        features=features,
    )
    return datasets.DatasetDict({"train": ds}), _sha(pixels.tobytes(), digits.target.tobytes())


def load_imagefolder(ref: str, revision: str | None = None):
    """A local folder: ``class_x/*.png`` or ``train/class_x/*.png`` + ``test/class_x/*.png``."""
    import datasets

    root = Path(ref).expanduser()
    if not root.is_dir():
        raise DataSourceError(f"data.source imagefolder:{ref}: {root} is not a directory of class sub-folders.")
    files = sorted(p for p in root.rglob("*") if p.is_file())
    if not files:
        raise DataSourceError(f"data.source imagefolder:{ref}: {root} contains no files.")
    stamp = [(str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    ds = datasets.load_dataset("imagefolder", data_dir=str(root))
    return ds, _sha("imagefolder", stamp)


def load_hub(ref: str, revision: str | None = None, config: str | None = None, streaming: bool = False):
    """A hub dataset id (the local `datasets` cache first; HF_DATASETS_OFFLINE=1 forbids the network), a local dataset
    folder, or a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (read with `load_from_disk`).
    `config`: the dataset's configuration name; `revision`: a hub branch, tag or commit. `streaming`: a
    `datasets.IterableDatasetDict` that has read nothing yet, and no fingerprint (`load_data` reads the examples it
    keeps, `hub.first_examples`, and fingerprints those)."""
    import datasets

    from .hub import load_saved, saved_to_disk

    kind = saved_to_disk(ref)
    if kind is not None:
        for key, value in (("config", config), ("revision", revision)):
            if value is not None:
                raise DataSourceError(f"data.{key} = {value!r}: hf:{ref} is a folder written by {kind}.save_to_disk, "
                                      f"which has no {'configurations' if key == 'config' else 'revisions'}; remove "
                                      f"data.{key} (or save the configuration you want into its own folder).")
        ds, fingerprints = load_saved(ref, kind)  # memory-mapped: only the examples a run keeps are read
        return ds, _sha("saved", ref, fingerprints)
    try:
        ds = datasets.load_dataset(ref, name=config, revision=revision, streaming=streaming)
    except (FileNotFoundError, ConnectionError, OSError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else ""
        if config is not None and "config" in reason.lower():
            raise DataSourceError(f"data.config = {config!r} is not a configuration of hf:{ref} ({reason}); set "
                                  "data.config to one it names, or remove it for the default.") from err
        raise DataSourceError(
            f"data.source hf:{ref} could not be loaded from the local cache or the hub "
            f"({type(err).__name__}: {reason}); download it where there is network and either keep the hub cache "
            "(HF_HOME) or save it with save_to_disk and use data.source hf:<that folder>; imagefolder:<dir> reads "
            "image files."
        ) from err
    if streaming:
        streams = ds if isinstance(ds, datasets.IterableDatasetDict) else datasets.IterableDatasetDict({"train": ds})
        return streams, None
    if not isinstance(ds, datasets.DatasetDict):
        ds = datasets.DatasetDict({"train": ds})
    fingerprints = {name: split._fingerprint for name, split in ds.items()}
    # Without a config the fingerprint is the one earlier versions wrote, so their feature caches stay valid.
    fingerprint = _sha("hub", ref, revision, fingerprints) if config is None else \
        _sha("hub", ref, config, revision, fingerprints)
    return ds, fingerprint


FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                         "Ankle boot"]


def _read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format: big-endian magic, dims, uint8 payload), gzipped or not (torchvision's
    `read_sn3_pascalvincent_tensor` opens plain files only, and Debian ships them gzipped)."""
    import gzip

    import numpy as np

    raw = (gzip.open if path.suffix == ".gz" else open)(path, "rb").read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_fashion_mnist(ref: str = "", revision: str | None = None):
    """Fashion-MNIST (70,000 28×28 grey images, 10 classes) from Debian's `dataset-fashion-mnist` files
    (converted once into the headprobe cache), else the hub copy `zalando-datasets/fashion_mnist`."""
    import datasets

    root = Path(ref).expanduser() if ref else FASHION_MNIST_DIR
    train_images, train_labels, test_images, test_labels = _fashion_mnist_files(root)
    files = {"train": (train_images, train_labels), "test": (test_images, test_labels)}
    if not all(p.exists() for pair in files.values() for p in pair):
        try:
            ds, fingerprint = load_hub("zalando-datasets/fashion_mnist", revision)
        except DataSourceError:
            raise DataSourceError(
                f"fashion-mnist: the IDX files are not in {root} and the hub copy is not cached; install them "
                f"with `{FASHION_MNIST_INSTALL}` (Debian) or point data.source at "
                "fashion-mnist:<dir with the four *-ubyte.gz files>."
            ) from None
        return ds, fingerprint
    stamp = [(p.name, p.stat().st_size) for pair in files.values() for p in pair]
    fingerprint = _sha("fashion-mnist", stamp)
    from headprobe.data.cache_dir import cache_root

    target = cache_root() / "data" / f"fashion-mnist-{fingerprint}"
    if target.exists():
        return datasets.load_from_disk(str(target)), fingerprint
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=FASHION_MNIST_CLASSES)})
    out = {}
    for split, (images, labels) in files.items():
        pixels, y = _read_idx(images), _read_idx(labels)
        out[split] = datasets.Dataset.from_dict({"image": list(pixels), "label": y.tolist()}, features=features)
    ds = datasets.DatasetDict(out)
    tmp = target.with_name(target.name + ".tmp")
    ds.save_to_disk(str(tmp))
    tmp.rename(target)
    return datasets.load_from_disk(str(target)), fingerprint


FASHION_MNIST_INSTALL = "apt-get install dataset-fashion-mnist"


def _fashion_mnist_files(root: Path) -> list[Path]:
    return [root / f"{prefix}-{kind}-idx{dims}-ubyte.gz" for prefix in ("train", "t10k")
            for kind, dims in (("images", 3), ("labels", 1))]


def _hub_copy_cached(dataset_id: str) -> bool:
    """Whether `dataset_id` has a folder in the Hugging Face caches, found by their environment variables and
    defaults (HF_DATASETS_CACHE, HF_HUB_CACHE, HF_HOME) without importing `datasets`."""
    import os

    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")).expanduser()
    owner, _, name = dataset_id.partition("/")
    places = (Path(os.environ.get("HF_DATASETS_CACHE", home / "datasets")).expanduser() / f"{owner}___{name}",
              Path(os.environ.get("HF_HUB_CACHE", home / "hub")).expanduser() / f"datasets--{owner}--{name}")
    return any(p.is_dir() for p in places)


def missing_data(source: str) -> str | None:
    """What is missing for `data.source` to load on this machine, as a sentence naming the fix, or None: the
    Fashion-MNIST IDX files (or its cached hub copy), an imagefolder's directory, a local `save_to_disk` folder.
    Checked without loading anything; a hub id and a plug-in's source are taken as present (only loading tells)."""
    name, ref = split_prefixed(source, DATA_SOURCES)
    if name == "fashion-mnist":
        root = Path(ref).expanduser() if ref else FASHION_MNIST_DIR
        absent = [p.name for p in _fashion_mnist_files(root) if not p.is_file()]
        if absent and not _hub_copy_cached("zalando-datasets/fashion_mnist"):  # `load_fashion_mnist`'s fallback
            return (f"data.source = {source!r}: {', '.join(absent)} not in {root}; install Debian's files with "
                    f"`{FASHION_MNIST_INSTALL}` (they go to {FASHION_MNIST_DIR}), or point data.source at "
                    "fashion-mnist:<dir with the four *-ubyte.gz files>.")
    if name == "imagefolder":
        root = Path(ref).expanduser()
        if not root.is_dir() or not any(p.is_file() for p in root.rglob("*")):
            what = "is not a directory" if not root.is_dir() else "holds no files"
            return (f"data.source = {source!r}: {root} {what}; point it at a folder of class sub-folders "
                    "(or train/ and test/ holding them).")
    if name == "hf" and ref.startswith(("/", ".", "~")) and not Path(ref).expanduser().exists():
        return (f"data.source = {source!r}: {Path(ref).expanduser()} does not exist; point it at a folder written "
                "by save_to_disk, or at a hub dataset id.")
    return None


def _stratified_subset(labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Indices of a class-stratified subset of `size` (sorted); all indices if size ≥ len."""
    import numpy as np
    from sklearn.model_selection import train_test_split

    n = len(labels)
    if size >= n:
        return np.arange(n)
    try:
        keep, _ = train_test_split(np.arange(n), train_size=size, stratify=labels, random_state=seed)
    except ValueError:
        warnings.warn(f"cannot stratify a subset of {size} over these classes; taking a random subset.", stacklevel=3)
        keep = np.random.default_rng(seed).permutation(n)[:size]
    return np.sort(keep)


def load_data(spec, revision: str | None = None) -> DataSplits:
    """Resolve `spec` (a `DataSpec`) to train/test splits with ``image`` and ``label`` columns."""
    import datasets
    import numpy as np

    prefix, ref = split_prefixed(spec.source, DATA_SOURCES)
    revision = revision if revision is not None else spec.revision
    hub_options = {key: value for key, value in (("config", spec.config), ("streaming", spec.streaming)) if value}
    raw, fingerprint = DATA_SOURCES.get(prefix)(ref, revision=revision, **hub_options)
    if spec.streaming:
        from .hub import read_streamed

        raw, fingerprint = read_streamed(raw, spec, identity=("streamed", spec.source, spec.config, revision))
    if spec.train_split not in raw:
        raise DataSourceError(
            f"data.train_split = {spec.train_split!r} is not a split of {spec.source}; "
            f"its splits are: {', '.join(raw)}."
        )
    train = raw[spec.train_split]
    for key, column in (("image_column", spec.image_column), ("label_column", spec.label_column)):
        if key == "label_column" and column == "label" and column not in train.column_names and prefix == "imagefolder":
            # `datasets` makes the label column from the class sub-folders, and none at all from a single one.
            raise DataSourceError(
                f"data.source {spec.source}: the folder holds one class folder (or images without class "
                "folders), so there are no labels; a probe needs at least 2 classes, one sub-folder each "
                "(class_a/*.png, class_b/*.png)."
            )
        if column not in train.column_names:
            raise DataSourceError(
                f"data.{key} = {column!r} is not a column of {spec.source}; "
                f"its columns are: {', '.join(train.column_names)}."
            )
    if spec.test_split in raw:
        test, split_note = raw[spec.test_split], f"the source's {spec.test_split!r} split"
    else:
        from sklearn.model_selection import train_test_split

        labels = np.asarray(train[spec.label_column])
        tr_idx, te_idx = train_test_split(
            np.arange(len(labels)), test_size=spec.test_fraction, stratify=labels, random_state=spec.split_seed
        )
        test, train = train.select(np.sort(te_idx)), train.select(np.sort(tr_idx))
        split_note = f"stratified {spec.test_fraction:g} of {spec.train_split!r} (split_seed {spec.split_seed})"

    label_feature = train.features[spec.label_column]
    if isinstance(label_feature, datasets.ClassLabel):
        class_names = list(label_feature.names)
    else:
        class_names = [str(v) for v in sorted(set(train[spec.label_column]) | set(test[spec.label_column]))]
        mapping = {name: i for i, name in enumerate(class_names)}
        train = train.map(lambda r: {spec.label_column: mapping[str(r[spec.label_column])]})
        test = test.map(lambda r: {spec.label_column: mapping[str(r[spec.label_column])]})

    splits = {}
    for name, ds in (("train", train), ("test", test)):
        ds = ds.select_columns([spec.image_column, spec.label_column])
        if spec.image_column != "image":
            ds = ds.rename_column(spec.image_column, "image")
        if spec.label_column != "label":
            ds = ds.rename_column(spec.label_column, "label")
        limit = getattr(spec.limit, name)
        if name == "train" and limit is not None and limit < len(class_names):
            raise DataSourceError(
                f"data.limit.train = {limit} is below the number of classes of {spec.source} ({len(class_names)}): "
                "a class-stratified subset needs at least one image of every class; raise data.limit.train to at "
                f"least {len(class_names)}."
            )
        if limit is not None:
            ds = ds.select(_stratified_subset(np.asarray(ds["label"]), limit, spec.split_seed))
        splits[name] = ds

    info = {
        "source": spec.source,
        "n_train": len(splits["train"]),
        "n_test": len(splits["test"]),
        "n_classes": len(class_names),
        "test_split": split_note,
        "limit": {"train": spec.limit.train, "test": spec.limit.test},
        "split_seed": spec.split_seed,
        "val_fraction": spec.val_fraction,
        "fingerprint": fingerprint,
    }
    # hf: options, recorded where set (streamed: the first limit.train / limit.test examples were read).
    info |= {key: value for key, value in (("config", spec.config), ("revision", revision),
                                           ("streaming", spec.streaming)) if value}
    return DataSplits(splits["train"], splits["test"], class_names, fingerprint, info)


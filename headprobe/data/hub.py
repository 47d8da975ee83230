"""`hf:` data beyond a plain hub id: a folder written by `save_to_disk`, a dataset config name, a revision, and
streaming, where only the examples a run keeps are read.

`load_hub` (`data.sources`) decides; the helpers here say what a folder is, read the first examples of a
streamed split, and fingerprint what was read by its content (a streamed dataset has no cache files to name it).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .errors import DataSourceError


def saved_to_disk(ref: str) -> str | None:
    """"DatasetDict" or "Dataset" when `ref` is a folder written by that class's `save_to_disk`, else None."""
    root = Path(ref).expanduser()
    if (root / "dataset_dict.json").is_file():
        return "DatasetDict"
    if (root / "state.json").is_file() and (root / "dataset_info.json").is_file():
        return "Dataset"
    return None


def load_saved(ref: str, kind: str):
    """(DatasetDict, fingerprint) of a `save_to_disk` folder; a saved `Dataset` becomes the DatasetDict's train
    split. Memory-mapped: nothing is read beyond the examples a run keeps."""
    import datasets
    import pyarrow.ipc

    root = Path(ref).expanduser()
    try:
        loaded = datasets.load_from_disk(str(root))
    except (OSError, pyarrow.ArrowException) as err:
        lines = str(err).strip().splitlines()
        damaged = damaged_arrow_file(root)
        where = f"{damaged} is damaged or cut short" if damaged else f"a file of {root} cannot be read"
        raise DataSourceError(f"data.source hf:{ref}: {where} ({type(err).__name__}: {lines[0] if lines else ''}); "
                              "save the dataset again with save_to_disk, or restore that folder from a copy.") from None
    ds = loaded if kind == "DatasetDict" else datasets.DatasetDict({"train": loaded})
    return ds, {name: split._fingerprint for name, split in ds.items()}


def damaged_arrow_file(root: Path) -> Path | None:
    """The first Arrow file under `root` (a `save_to_disk` folder) that pyarrow cannot read whole, or None."""
    import pyarrow.ipc

    for path in sorted(root.rglob("*.arrow")):
        try:
            with pyarrow.memory_map(str(path)) as source:
                pyarrow.ipc.open_stream(source).read_all()
        except (OSError, pyarrow.ArrowException):
            return path
    return None


def first_examples(stream, n: int):
    """The first `n` examples of a streamed split (`datasets.IterableDataset`) as a `datasets.Dataset`; only those
    are read (``take``)."""
    import datasets

    rows = list(stream.take(n))
    if not rows:
        raise ValueError("the streamed split yielded no examples")
    features = stream.features
    return datasets.Dataset.from_list(rows, features=features) if features is not None else \
        datasets.Dataset.from_list(rows)


def content_fingerprint(dataset) -> str:
    """sha256 (16 hex) over a `datasets.Dataset`'s Arrow buffers and schema: equal exactly when the examples are."""
    h = hashlib.sha256(str(dataset.features).encode())
    table = dataset.data.table
    for column in table.columns:
        for chunk in column.chunks:
            for buffer in chunk.buffers():
                if buffer is not None:
                    h.update(memoryview(buffer))
    return h.hexdigest()[:16]


def read_streamed(streams, spec, identity: tuple) -> tuple:
    """(DatasetDict, fingerprint) from a streamed `datasets.IterableDatasetDict`: the first ``data.limit.train``
    examples of the train split and the first ``data.limit.test`` of the test split; without a test split, the first
    ``limit.train + limit.test`` of train, which `load_data` then splits by ``test_fraction`` as it does unstreamed.
    Nothing after those is read. The fingerprint hashes `identity` and the examples read."""
    import datasets

    from .errors import DataSourceError

    limit = spec.limit
    if limit.train is None or limit.test is None:
        raise DataSourceError("data.streaming: true reads only the first data.limit.train and data.limit.test "
                              "examples; set both limits (e.g. data.limit: {train: 5000, test: 1000}).")
    if spec.train_split not in streams:
        raise DataSourceError(f"data.train_split = {spec.train_split!r} is not a split of {spec.source}; its splits "
                              f"are: {', '.join(streams)}.")
    has_test = spec.test_split in streams
    counts = {spec.train_split: limit.train + (0 if has_test else limit.test)}
    if has_test:
        counts[spec.test_split] = limit.test
    kept = {}
    for split, n in counts.items():
        try:
            kept[split] = first_examples(streams[split], n)
        except ValueError as err:
            raise DataSourceError(f"data.source {spec.source}, split {split!r}: {err}.") from None
    content = {name: content_fingerprint(ds) for name, ds in kept.items()}
    return datasets.DatasetDict(kept), hashlib.sha256(repr((identity, content)).encode()).hexdigest()[:16]

"""A damaged Arrow file of a `save_to_disk` folder (#40) is one sentence naming the file and the fix, not pyarrow's
raw text."""

import pytest

from headprobe.data.errors import DataSourceError
from headprobe.data.sources import load_hub


def _saved(root):
    import datasets

    split = datasets.Dataset.from_dict({"x": list(range(40)), "label": [i % 2 for i in range(40)]})
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(root))
    return root


def test_a_saved_dataset_cut_short_names_its_damaged_file(tmp_path):
    root = _saved(tmp_path / "ds")
    assert load_hub(str(root))[0]["train"].num_rows == 40
    (arrow,) = sorted((root / "test").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:-64])
    with pytest.raises(DataSourceError) as caught:
        load_hub(str(root))
    message = str(caught.value)
    assert message.startswith(f"data.source hf:{root}: {arrow} is damaged or cut short (")
    assert message.endswith("save the dataset again with save_to_disk, or restore that folder from a copy.")
    assert "\n" not in message

"""Dataset loading: every file format, directories, dataset.py, validation split, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ace3.config import TrainingConfig
from ace3.runtime.data.datasets import load_dataset, load_datasets, split_holdout
from ace3.runtime.job_spec import DatasetSpec


def _spec(path: Path) -> DatasetSpec:
    return DatasetSpec(path=str(path))


def _xy(ds):
    return ds.tensors  # TensorDataset


def test_pt_dict(tmp_path: Path) -> None:
    path = tmp_path / "d.pt"
    torch.save({"inputs": torch.randn(5, 3, dtype=torch.float64), "targets": torch.arange(5)}, path)
    x, y = _xy(load_dataset(_spec(path), "train"))
    assert x.shape == (5, 3) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and y.tolist() == [0, 1, 2, 3, 4]


def test_pt_tuple(tmp_path: Path) -> None:
    path = tmp_path / "d.pt"
    torch.save((torch.randn(4, 2), torch.randn(4)), path)
    x, y = _xy(load_dataset(_spec(path), "train"))
    assert x.shape == (4, 2) and y.dtype == torch.float32


def test_pt_refuses_pickled_objects(tmp_path: Path) -> None:
    path = tmp_path / "d.pt"
    torch.save({"inputs": np.zeros((2, 2)), "targets": [object()]}, path)
    with pytest.raises(ValueError, match=r"d\.pt.*weights_only=True"):
        load_dataset(_spec(path), "train")


def test_pt_wrong_layout(tmp_path: Path) -> None:
    path = tmp_path / "d.pt"
    torch.save({"a": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match=r"d\.pt: expected keys inputs/targets"):
        load_dataset(_spec(path), "train")


@pytest.mark.parametrize(
    "keys", [("inputs", "targets"), ("x", "y"), ("X", "y"), ("features", "labels")]
)
def test_npz_key_pairs(tmp_path: Path, keys: tuple[str, str]) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, **{keys[0]: np.ones((6, 4)), keys[1]: np.arange(6, dtype=np.int32)})
    x, y = _xy(load_dataset(_spec(path), "train"))
    assert x.shape == (6, 4) and x.dtype == torch.float32 and y.dtype == torch.int64


def test_npz_missing_keys_and_length_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, a=np.ones(3))
    with pytest.raises(ValueError, match=r"bad\.npz: expected keys .*found \['a'\]"):
        load_dataset(_spec(path), "train")
    np.savez(path, x=np.ones((3, 2)), y=np.ones(4))
    with pytest.raises(ValueError, match="3 inputs but 4 targets"):
        load_dataset(_spec(path), "train")


def test_csv_target_column_by_name(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("a,label,b\n1.5,0,2\n2.5,1,3\n\n3.5,2,4\n")
    x, y = _xy(load_dataset(_spec(path), "train"))
    assert x.tolist() == [[1.5, 2.0], [2.5, 3.0], [3.5, 4.0]]
    assert y.dtype == torch.int64 and y.tolist() == [0, 1, 2]


def test_csv_last_column_float_target(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("f1,f2,price\n1,2,3.25\n4,5,6.0\n")
    x, y = _xy(load_dataset(_spec(path), "train"))
    assert x.dtype == torch.float32 and y.dtype == torch.float32
    assert y.tolist() == [3.25, 6.0]


def test_csv_errors_name_file_and_cell(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("f1,target\n1,2\nabc,3\n")
    with pytest.raises(ValueError, match=r"d\.csv: line 3, column 'f1': 'abc' is not a number"):
        load_dataset(_spec(path), "train")
    path.write_text("")
    with pytest.raises(ValueError, match="empty CSV"):
        load_dataset(_spec(path), "train")
    path.write_text("f1,target\n1,2,3\n")
    with pytest.raises(ValueError, match="line 2 has 3 cells"):
        load_dataset(_spec(path), "train")


def test_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    rows = [{"inputs": [0.5, 1.0], "target": 1}, {"inputs": [1.5, 2.0], "target": 0}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    x, y = _xy(load_dataset(_spec(path), "train"))
    assert x.dtype == torch.float32 and x.shape == (2, 2)
    assert y.dtype == torch.int64 and y.tolist() == [1, 0]


def test_jsonl_errors(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"inputs": [1]}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl: line 1: no 'target'"):
        load_dataset(_spec(path), "train")
    path.write_text("not json\n")
    with pytest.raises(ValueError, match="line 1 is not valid JSON"):
        load_dataset(_spec(path), "train")


def test_directory_with_one_file(tmp_path: Path) -> None:
    np.savez(tmp_path / "only.npz", x=np.ones((3, 2)), y=np.zeros(3, dtype=np.int64))
    (tmp_path / "README.txt").write_text("ignored")
    assert len(load_dataset(_spec(tmp_path), "train")) == 3


def test_directory_with_two_files_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", x=np.ones((3, 2)), y=np.zeros(3))
    np.savez(tmp_path / "b.npz", x=np.ones((3, 2)), y=np.zeros(3))
    with pytest.raises(ValueError, match=r"exactly one data file.*a\.npz, b\.npz"):
        load_dataset(_spec(tmp_path), "train")


def test_directory_with_dataset_py(tmp_path: Path) -> None:
    (tmp_path / "dataset.py").write_text(
        "import torch\n"
        "from torch.utils.data import TensorDataset\n"
        "def build_dataset(split):\n"
        "    n = 10 if split == 'train' else 4\n"
        "    return TensorDataset(torch.zeros(n, 3), torch.zeros(n, dtype=torch.long))\n"
    )
    config = TrainingConfig()
    data = load_datasets(_spec(tmp_path), None, config)
    assert len(data.train) == 10
    assert data.validation is not None and len(data.validation) == 4


def test_dataset_py_tuple_and_none(tmp_path: Path) -> None:
    (tmp_path / "dataset.py").write_text(
        "import numpy as np\n"
        "def build_dataset(split):\n"
        "    return (np.ones((5, 2)), np.arange(5)) if split == 'train' else None\n"
    )
    data = load_datasets(_spec(tmp_path), None, TrainingConfig(validation_split=0))
    assert len(data.train) == 5 and data.validation is None
    # Left at its default, validation_split holds out 10% (at least one sample) instead.
    default = load_datasets(_spec(tmp_path), None, TrainingConfig())
    assert default.validation is not None
    assert (len(default.train), len(default.validation)) == (4, 1)


def test_unknown_suffix_and_missing(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    path.write_text("x")
    with pytest.raises(ValueError, match=r"unsupported dataset file type '\.parquet'"):
        load_dataset(_spec(path), "train")
    with pytest.raises(FileNotFoundError, match="dataset not found"):
        load_dataset(_spec(tmp_path / "nope.npz"), "train")


def test_validation_split_is_deterministic_and_disjoint(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.arange(100, dtype=np.float32)[:, None], y=np.arange(100))
    config = TrainingConfig(validation_split=0.2, seed=7)
    first = load_datasets(_spec(path), None, config)
    second = load_datasets(_spec(path), None, config)
    assert first.validation is not None and second.validation is not None
    assert len(first.train) == 80 and len(first.validation) == 20
    assert first.validation.indices == second.validation.indices
    assert not set(first.train.indices) & set(first.validation.indices)
    other = load_datasets(_spec(path), None, TrainingConfig(validation_split=0.2, seed=8))
    assert other.validation.indices != first.validation.indices


def test_validation_dataset_wins_over_split(tmp_path: Path) -> None:
    train, val = tmp_path / "t.npz", tmp_path / "v.npz"
    np.savez(train, x=np.ones((10, 2)), y=np.zeros(10))
    np.savez(val, x=np.ones((3, 2)), y=np.zeros(3))
    data = load_datasets(_spec(train), _spec(val), TrainingConfig(validation_split=0.5))
    assert len(data.train) == 10 and data.validation is not None and len(data.validation) == 3


def test_split_needs_two_samples() -> None:
    ds = torch.utils.data.TensorDataset(torch.zeros(1, 1), torch.zeros(1))
    with pytest.raises(ValueError, match="at least 2 samples"):
        split_holdout(ds, 0.5, 0)

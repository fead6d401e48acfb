"""Writes scikit-learn's bundled digits (no download) as train/validation .npz files."""

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def write_digits(directory: Path, seed: int = 0) -> tuple[Path, Path]:
    digits = load_digits()
    inputs = (digits.data / 16.0).astype(np.float32)
    targets = digits.target.astype(np.int64)
    x_train, x_val, y_train, y_val = train_test_split(
        inputs, targets, test_size=0.2, random_state=seed, stratify=targets
    )
    directory.mkdir(parents=True, exist_ok=True)
    train_path, val_path = directory / "digits-train.npz", directory / "digits-val.npz"
    np.savez(train_path, inputs=x_train, targets=y_train)
    np.savez(val_path, inputs=x_val, targets=y_val)
    return train_path, val_path


if __name__ == "__main__":  # `python examples/digits/data.py`: the files job.yaml names
    for written in write_digits(Path(__file__).resolve().parent / "data"):
        print(written)

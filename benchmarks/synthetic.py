"""Synthetic classification data and a model file for the benchmarks that run real jobs
(nothing is downloaded): Gaussian inputs labelled by a fixed random linear teacher."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_inputs(root: Path, samples: int, inputs: int, model_file: str) -> tuple[Path, Path]:
    """``root/data.npz`` (``inputs``, ``targets``: ``samples`` rows, 10 classes, seed 0) and
    ``root/model.py`` holding ``model_file``; their paths (model, data)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((samples, inputs), dtype=np.float32)
    teacher = rng.standard_normal((inputs, 10), dtype=np.float32)
    y = (x @ teacher).argmax(axis=1).astype(np.int64)
    data = root / "data.npz"
    np.savez(data, inputs=x, targets=y)
    model = root / "model.py"
    model.write_text(model_file)
    return model, data

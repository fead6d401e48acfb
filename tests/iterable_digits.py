"""A ``dataset.py`` whose ``build_dataset`` returns an ``IterableDataset``, for the engine's tests:
the samples of a ``data.npz`` beside it, split by the ``rank`` and ``world_size`` it is given and
by ``get_worker_info()``, shuffled per ``set_epoch`` (the pattern docs/runtime.md shows).

:func:`write_iterable_dataset` writes one into a directory: ``stateful`` gives the dataset
``state_dict()`` / ``load_state_dict()``; ``validation`` is how many samples (the file's last)
its ``'validation'`` split holds (0: None); a ``seen/`` directory beside it makes every reader
record the samples it gives (``<split> <epoch> <rank> <worker> <index>`` lines, one file per
process; the index is in the split: the validation split's are the file's last).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATASET_PY = """
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

HERE = Path(__file__).parent
STATEFUL = {stateful}
VALIDATION = {validation}


class Digits(IterableDataset):
    def __init__(self, split, inputs, targets, rank, world_size):
        self.split, self.inputs, self.targets = split, inputs, targets
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.position = 0  # samples of this reader's share given out
        self.resumed = False

    def set_epoch(self, epoch):
        self.epoch, self.position = epoch, 0

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        reader, readers = self.rank * workers + worker, self.world_size * workers
        order = np.arange(len(self.targets))
        if self.split == "train":
            order = np.random.default_rng([7, self.epoch]).permutation(len(self.targets))
        share = order[reader::readers]
        if not self.resumed:
            self.position = 0
        self.resumed = False
        seen = HERE / "seen"
        record = open(seen / f"{{os.getpid()}}.txt", "a") if seen.is_dir() else None
        try:
            while self.position < len(share):
                index = int(share[self.position])
                self.position += 1  # before the yield: a state taken now points past it
                if record is not None:
                    words = (self.split, self.epoch, self.rank, worker, index)
                    record.write(" ".join(map(str, words)) + "\\n")
                    record.flush()
                yield torch.from_numpy(self.inputs[index]), int(self.targets[index])
        finally:
            if record is not None:
                record.close()


class ResumableDigits(Digits):
    def state_dict(self):
        return {{"epoch": self.epoch, "position": self.position}}

    def load_state_dict(self, state):
        self.epoch, self.position, self.resumed = state["epoch"], state["position"], True


def build_dataset(split, rank, world_size):
    data = np.load(HERE / "data.npz")
    inputs, targets = data["inputs"], data["targets"]
    kind = ResumableDigits if STATEFUL else Digits
    if split == "validation":
        if not VALIDATION:
            return None
        tail = slice(len(targets) - VALIDATION, None)
        return kind(split, inputs[tail], targets[tail], rank, world_size)
    head = slice(0, len(targets) - VALIDATION)
    return kind(split, inputs[head], targets[head], rank, world_size)
"""


def write_iterable_dataset(
    directory: Path,
    inputs: np.ndarray,
    targets: np.ndarray,
    *,
    stateful: bool,
    validation: int = 0,
    record: bool = False,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    np.savez(directory / "data.npz", inputs=inputs, targets=targets)
    (directory / "dataset.py").write_text(
        DATASET_PY.format(stateful=stateful, validation=validation)
    )
    if record:
        (directory / "seen").mkdir(exist_ok=True)
    return directory


def seen_samples(directory: Path, split: str = "train") -> list[tuple[int, int, int, int]]:
    """(epoch, rank, worker, index) of every sample of ``split`` the readers recorded."""
    rows = []
    for path in sorted((directory / "seen").glob("*.txt")):
        for line in path.read_text().splitlines():
            name, epoch, rank, worker, index = line.split()
            if name == split:
                rows.append((int(epoch), int(rank), int(worker), int(index)))
    return rows

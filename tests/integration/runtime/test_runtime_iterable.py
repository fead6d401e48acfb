"""A ``dataset.py`` returning an ``IterableDataset`` through the engine under real torchrun (2
gloo ranks, CPU), on 280 of scikit-learn's digits (:mod:`tests.iterable_digits`: split by the
``rank`` and ``world_size`` ``build_dataset`` gets and by ``get_worker_info()``).

240 training samples over 2 ranks x 2 loader workers: 60 a reader, 4 batches of 16 (the last
12) each, so 8 batches a rank per dataset epoch; ``max_steps=20`` cycles through two and a half
of them. A resume starts from the step-10 checkpoint of an undisturbed run (the same job, as a
worker's retry would), 2 batches into its dataset epoch 1. (A dataset without state_dict, the
refusal of epochs and lockstep validation padding are unit tests:
tests/unit/runtime/test_iterable_datasets.py.)
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.integration.runtime.test_runtime_torchrun import (
    MODEL_FILE,
    assert_ok,
    events,
    run_job,
    train_losses,
)
from tests.iterable_digits import seen_samples, write_iterable_dataset

pytestmark = pytest.mark.slow

TRAIN, VALIDATION = 240, 40


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("iterable")
    digits = load_digits()
    inputs = (digits.data[: TRAIN + VALIDATION] / 16.0).astype(np.float32)
    targets = digits.target[: TRAIN + VALIDATION].astype(np.int64)
    write_iterable_dataset(
        root / "resumable", inputs, targets, stateful=True, validation=VALIDATION, record=True
    )
    (root / "model.py").write_text(MODEL_FILE)
    return root


def iterable_job(workdir: Path, data: str, **config: Any) -> dict[str, Any]:
    return {
        "job_id": f"iterable-{data}",
        "attempt": 1,
        "config": {
            "num_gpus": 2, "batch_size": 32, "learning_rate": 0.01, "max_steps": 20,
            "num_workers": 2, "log_interval": 5, "save_interval": 10, "seed": 7, **config,
        },
        "model": {"path": str(workdir / "model.py"), "kind": "file", "factory": "build_model"},
        "dataset": {"path": str(workdir / data)},
        "validation_dataset": None,
        "resume_from": None,
    }  # fmt: skip


def checkpoints(job_dir: Path) -> list[dict[str, Any]]:
    return [e for e in events(job_dir) if e["type"] == "checkpoint"]


def resumed_from_step_10(whole: Path, job: dict[str, Any], job_dir: Path) -> str:
    first = checkpoints(whole)[0]
    assert first["step"] == 10
    done = run_job({**job, "resume_from": first["path"], "resume_sha256": first["sha256"]}, job_dir)
    assert_ok(done)
    assert "resumed from" in done.stdout
    return done.stdout


@pytest.fixture(scope="module")
def resumable_run(workdir: Path) -> tuple[Path, str, list[tuple[int, int, int, int]]]:
    """The undisturbed run of the dataset with state: (its directory, its output, the training
    samples its readers gave: (dataset epoch, rank, worker, index))."""
    job_dir = workdir / "resumable-whole"
    done = run_job(iterable_job(workdir, "resumable"), job_dir)
    assert_ok(done)
    return job_dir, done.stdout, seen_samples(workdir / "resumable")


def test_it_trains_exactly_max_steps_each_reader_on_its_own_samples(
    resumable_run: tuple[Path, str, list[tuple[int, int, int, int]]],
) -> None:
    job_dir, out, seen = resumable_run
    assert "the IterableDataset ResumableDigits, cycling" in out
    evs = events(job_dir)
    assert (evs[0]["total_steps"], evs[0]["epochs"], evs[0]["steps_per_epoch"]) == (20, 1, 20)
    assert [s for s, _ in train_losses(evs)] == [1, 5, 10, 15, 20]
    assert evs[-1]["type"] == "summary" and evs[-1]["steps"] == 20
    assert evs[-1]["final_metrics"]["val_accuracy"] >= 0.5  # (the 40 held-back samples)
    readers: dict[int, dict[tuple[int, int], list[int]]] = defaultdict(lambda: defaultdict(list))
    for epoch, rank, worker, index in seen:
        readers[epoch][(rank, worker)].append(index)
    assert sorted(readers) == [0, 1, 2]  # set_epoch(0), (1), (2): it cycled
    for epoch in (0, 1):  # whole dataset epochs: 4 readers of 60, every sample once
        shares = readers[epoch]
        assert sorted(shares) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert all(len(share) == 60 for share in shares.values())
        assert sorted(i for share in shares.values() for i in share) == list(range(TRAIN))
    assert readers[0][(0, 0)] != readers[1][(0, 0)]  # reshuffled by its epoch
    third = [i for share in readers[2].values() for i in share]  # (what the workers read of it)
    assert third and len(set(third)) == len(third)


def test_a_resume_with_state_dict_ends_bit_identical(
    workdir: Path, resumable_run: tuple[Path, str, list[tuple[int, int, int, int]]]
) -> None:
    whole = resumable_run[0]
    job_dir = workdir / "resumable-resumed"
    out = resumed_from_step_10(whole, iterable_job(workdir, "resumable"), job_dir)
    assert "restarts from its beginning" not in out
    a, b = _final_weights(whole), _final_weights(job_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    later = [(s, v) for s, v in train_losses(events(whole)) if s > 10]
    assert later and train_losses(events(job_dir)) == later


def _final_weights(job_dir: Path) -> dict[str, torch.Tensor]:
    last = checkpoints(job_dir)[-1]
    if last["name"].endswith(".pt"):
        return torch.load(Path(last["path"]), weights_only=True)["model"]
    from ace3.runtime.checkpoint.sharded import consolidate

    return consolidate(Path(last["path"]))["model"]

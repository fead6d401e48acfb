"""The fit rules: which workers can run a job, and the 422 message when none of them can."""

from __future__ import annotations

import pytest

import ace3
from ace3_control.capacity import Capacity, JobNeeds, cluster_problem, describe, fit_problem

CPU2 = Capacity("cpu", 2)
CPU8 = Capacity("cpu", 8)
GPU1 = Capacity("cuda", 1)
GPU4 = Capacity("cuda", 4)


def test_with_no_worker_registered_every_job_is_admitted() -> None:
    assert cluster_problem(JobNeeds(64, "nccl"), []) is None


@pytest.mark.parametrize(
    ("needs", "workers"),
    [
        (JobNeeds(2, "auto"), [CPU2]),
        (JobNeeds(8, "gloo"), [CPU2, CPU8]),
        (JobNeeds(4, "nccl"), [CPU8, GPU4]),
        (JobNeeds(4, "auto"), [GPU4]),
        (JobNeeds(4, "gloo"), [GPU1, GPU4]),
    ],
)
def test_a_job_some_worker_fits_is_admitted(needs: JobNeeds, workers: list[Capacity]) -> None:
    assert cluster_problem(needs, workers) is None


def test_more_processes_than_the_largest_worker_is_refused_on_num_gpus() -> None:
    problem = cluster_problem(JobNeeds(16, "auto"), [CPU2, CPU8])
    assert problem is not None and problem.field == "num_gpus"
    assert "num_gpus=16" in problem.message
    assert "the largest live worker has 8 CPU processes" in problem.message
    assert "2 live workers: 2 CPU processes, 8 CPU processes" in problem.message
    assert "use num_gpus <= 8" in problem.message


def test_nccl_without_a_cuda_worker_is_refused_on_backend() -> None:
    problem = cluster_problem(JobNeeds(1, "nccl"), [CPU8])
    assert problem is not None and problem.field == "backend"
    assert "backend='nccl' needs a CUDA worker" in problem.message
    assert "1 live worker: 8 CPU processes" in problem.message
    assert "backend='auto'" in problem.message


def test_nccl_counts_only_cuda_workers() -> None:
    problem = cluster_problem(JobNeeds(4, "nccl"), [CPU8, GPU1])
    assert problem is not None and problem.field == "num_gpus"
    assert "the largest live CUDA worker has 1 GPU " in problem.message


def test_a_worker_with_no_device_suggests_adding_one() -> None:
    problem = cluster_problem(JobNeeds(1, "auto"), [Capacity("cuda", 0)])
    assert problem is not None and "add a worker with at least one device" in problem.message


def test_fit_problem_of_one_worker() -> None:
    assert fit_problem(JobNeeds(2, "auto"), CPU2) is None
    assert fit_problem(JobNeeds(4, "nccl"), GPU4) is None
    assert fit_problem(JobNeeds(3, "gloo"), CPU2) == (
        "the job runs 3 processes on one worker, and this worker has 2 CPU processes"
    )
    reason = fit_problem(JobNeeds(1, "nccl"), CPU8)
    assert reason is not None and "backend='nccl' needs a CUDA worker" in reason


def test_describe_counts_in_the_worker_s_own_unit() -> None:
    assert [describe(c) for c in (GPU1, GPU4, Capacity("cpu", 1), CPU8)] == [
        "1 GPU",
        "4 GPUs",
        "1 CPU process",
        "8 CPU processes",
    ]


def test_job_needs_from_a_config_and_from_its_stored_json() -> None:
    config = ace3.TrainingConfig(num_gpus=4, backend="nccl", batch_size=32)
    assert JobNeeds.from_config(config) == JobNeeds(4, "nccl")
    assert JobNeeds.from_config(config.model_dump(mode="json")) == JobNeeds(4, "nccl")
    assert JobNeeds.from_config({}) == JobNeeds(1, "auto")


def test_capacity_refuses_unknown_kinds_and_negative_counts() -> None:
    with pytest.raises(ValueError, match="device_kind"):
        Capacity("tpu", 1)
    with pytest.raises(ValueError, match="device_count"):
        Capacity("cpu", -1)

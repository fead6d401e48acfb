"""Under the CUDA_VISIBLE_DEVICES a worker gives each job (its own GPUs, renumbered 0..N-1 by
CUDA), local rank i trains on cuda:i, and a rank beyond the job's GPUs fails naming them.
(CUDA is faked: no GPU on this machine; only the choice is tested.)"""

from __future__ import annotations

import pytest
import torch

from ace3.config import TrainingConfig
from ace3.runtime.process.distributed import resolve_device_and_backend


@pytest.fixture()
def two_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACE3_DEVICE", "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.mark.usefixtures("two_visible_gpus")
@pytest.mark.parametrize("local_rank", [0, 1])
def test_local_rank_i_uses_the_jobs_ith_gpu(local_rank: int) -> None:
    device, backend = resolve_device_and_backend(TrainingConfig(num_gpus=2), local_rank)
    assert (device, backend) == (torch.device("cuda", local_rank), "nccl")


@pytest.mark.usefixtures("two_visible_gpus")
def test_a_rank_beyond_the_jobs_gpus_names_them() -> None:
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=2 but only 2 CUDA device\(s\) are "
                       r"visible \(CUDA_VISIBLE_DEVICES='2,3'\)"):  # fmt: skip
        resolve_device_and_backend(TrainingConfig(num_gpus=2), 2)

"""Run under torchrun (2 gloo ranks) by test_runtime_instability.py: three in-process runs on
one process group (one launch: the ranks start once), each with the instability guard set to
another action; rank 0 writes what the test checks to ``<out>/results.json``.

- ``skip``: NaN on rank 1 at step 5, a loss spike on rank 1 at step 7, a checkpoint every step;
- ``rollback``: NaN on rank 1 at step 5, checkpoints every 3 steps;
- ``stop``: NaN on rank 1 at step 3.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import ace3
from tests.model_files import UNSTABLE_MODEL_FILE

OUT = Path(sys.argv[1])
ONLY = os.environ.get("ACE3_TEST_RUNS", "skip,rollback,stop").split(",")
namespace: dict[str, Any] = {}
exec(compile(UNSTABLE_MODEL_FILE, "unstable_model.py", "exec"), namespace)
generator = torch.Generator().manual_seed(0)
DATA = (torch.randn(64, 8, generator=generator), torch.randint(0, 3, (64,), generator=generator))
# 64 samples, a global batch of 8 (4 a rank): 8 optimizer steps in the epoch.
BASE = {"num_gpus": 2, "batch_size": 8, "epochs": 1, "validation_split": 0.0, "seed": 0,
        "learning_rate": 0.05, "log_interval": 2}  # fmt: skip


def train(name: str, guard: ace3.InstabilityConfig, save_interval: int, **model: int) -> Any:
    config = ace3.TrainingConfig(**BASE, instability=guard, save_interval=save_interval)
    directory = OUT / name
    checkpoints = ace3.CheckpointConfig(save_dir=str(directory), save_interval=save_interval)
    return ace3.Trainer(config, checkpoint_config=checkpoints).train(
        namespace["build_model"](**model), DATA
    )


dist.init_process_group("gloo")  # one group for every run (the Trainer uses the caller's)
results: dict[str, Any] = {}
runs: dict[str, Any] = {}
if "skip" in ONLY:
    runs["skip"] = train("skip", ace3.InstabilityConfig(action="skip", explosion_factor=3.0), 1,
                         nan_at=5, spike_at=7, rank=1)  # fmt: skip
if "rollback" in ONLY:
    runs["rollback"] = train("rollback", ace3.InstabilityConfig(action="rollback", explosion_factor=50.0),
                             3, nan_at=5)  # fmt: skip
for name, run in runs.items():
    results[name] = {
        "records": [record.model_dump() for record in run.instabilities],
        "history": run.history,
        "final": run.final_metrics,
    }
if "stop" in ONLY:
    try:
        train("stop", ace3.InstabilityConfig(action="stop"), 100, nan_at=3)
        results["stop"] = "no error"
    except ace3.InstabilityError as error:
        results["stop"] = {"message": str(error), "step": error.step, "reason": error.reason}
if dist.get_rank() == 0:
    (OUT / "results.json").write_text(json.dumps(results))
dist.destroy_process_group()

"""The instability guard on 2 gloo ranks (real torchrun, CPU): ``skip`` drops exactly the
unstable steps (a NaN on rank 1 at step 5, a loss spike at step 7), ``rollback`` goes back to
the checkpoint before the NaN with half the learning rate and trains on from there, ``stop``
fails the run with the reason. Both ranks decide together (only rank 1's loss goes bad).

One launch runs the three (instability_runs.py): the ranks start once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def _load(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _weights(directory: Path, step: int) -> dict[str, torch.Tensor]:
    return _load(directory / f"step-{step:08d}.pt")["model"]


def _adam_state(directory: Path, step: int) -> list[torch.Tensor]:
    state = _load(directory / f"step-{step:08d}.pt")["optimizer"]["state"]
    return [tensor for key in sorted(state) for tensor in state[key].values()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("instability")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACE3_DEVICE": "cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "sdk"), str(ROOT)])}  # fmt: skip
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(HERE / "instability_runs.py"), str(out)],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, {"log": done.stdout, **json.loads((out / "results.json").read_text())}


def test_skip_drops_exactly_the_unstable_steps(runs: tuple[Path, dict[str, Any]]) -> None:
    out, results = runs
    skip = results["skip"]
    assert [(r["step"], r["action"]) for r in skip["records"]] == [(5, "skip"), (7, "skip")]
    assert skip["records"][0]["reason"] == "loss nan" and skip["records"][0]["loss"] is None
    spike = skip["records"][1]
    assert spike["reason"].startswith("loss ") and "> 3 x recent minimum" in spike["reason"]
    assert spike["loss"] > 3 * min(loss for _, loss in skip["history"]["train_loss"])
    # A checkpoint every step: the skipped steps changed neither the weights nor Adam's state.
    directory = out / "skip"
    for step in range(2, 9):
        unchanged = _same(_weights(directory, step), _weights(directory, step - 1))
        assert unchanged == (step in (5, 7)), step
    for before, after in zip(_adam_state(directory, 4), _adam_state(directory, 5), strict=True):
        assert torch.equal(before, after)
    assert skip["final"]["steps"] == 8 and all(
        value == value for _, value in skip["history"]["train_loss"]
    ), "a skipped NaN never reaches the reported loss"
    # grad_norm comes with every training metrics report
    assert [s for s, _ in skip["history"]["grad_norm"]] == [1, 2, 4, 6, 8]
    assert "step 5: training instability: loss nan; step skipped" in results["log"]


def test_rollback_resumes_from_the_checkpoint_before_with_a_lower_rate(
    runs: tuple[Path, dict[str, Any]],
) -> None:
    out, results = runs
    rollback = results["rollback"]
    (record,) = rollback["records"]
    assert (record["step"], record["action"], record["rolled_back_to_step"]) == (5, "rollback", 3)
    assert record["lr_scale"] == 0.5
    history = rollback["history"]
    # Step 4 ran twice: first at 0.05, then, from step 3's checkpoint, at 0.025 (same loss: the
    # same weights and batch); every later step at the lowered rate.
    assert history["learning_rate"] == [[1, 0.05], [2, 0.05], [4, 0.05], [4, 0.025], [6, 0.025],
                                        [8, 0.025]]  # fmt: skip
    losses = history["train_loss"]
    assert [s for s, _ in losses] == [1, 2, 4, 4, 6, 8] and losses[2][1] == losses[3][1]
    assert history["lr_scale"] == [[4, 0.5], [6, 0.5], [8, 0.5]]
    final = _load(out / "rollback" / "step-00000008.pt")
    assert (final["lr_scale"], final["rollbacks"]) == (0.5, 1)  # carried to a resume
    assert (
        "step 5: training instability: loss nan; rolled back to step 3, learning rate x0.5"
        in (results["log"])
    )


def test_stop_fails_the_run_with_the_reason(runs: tuple[Path, dict[str, Any]]) -> None:
    _, results = runs
    assert results["stop"] == {
        "message": "training instability at step 3: loss nan (instability.action='stop')",
        "step": 3,
        "reason": "loss nan",
    }

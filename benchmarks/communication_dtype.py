"""The effect of ``communication_data_type`` on the loss curve: gradients averaged in float16
(or bfloat16) against float32, side by side.

The same MLP (``--inputs``-``--width``x``--depth``-10, ReLU, AdamW) on the same synthetic
``.npz`` data (:mod:`benchmarks.synthetic`), the same seed, global batch and sampler, trained
for ``--steps`` optimizer steps on 2 gloo processes under ``torchrun`` (the engine's entry point,
``-m ace3.runtime --job job.json``) once per reduction dtype: ``fp32`` (the default: the
gradients' own dtype), ``fp16`` (DDP's ``fp16_compress_hook``; at ``--zero-stage`` 2/3 FSDP2's
``reduce_dtype``) and ``bf16``. Every step's ``train_loss`` is reported (``log_interval=1``).

Printed: the curves every ``--every`` steps side by side, then for each compressed run the
largest absolute and relative difference from the fp32 curve over all steps, and the final
loss (the mean of the last 10 steps) of each. ::

    .venv/bin/python benchmarks/communication_dtype.py [--steps 200] [--zero-stage 0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.synthetic import write_inputs  # noqa: E402

MODEL_FILE = """
from torch import nn


def build_model(inputs, width, depth):
    layers = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))
"""

DTYPES = ("fp32", "fp16", "bf16")


def run(root: Path, model: Path, data: Path, dtype: str, args: argparse.Namespace) -> list[float]:
    """One torchrun of the engine; its train_loss at every step."""
    out = root / dtype
    config: dict[str, Any] = {
        "num_gpus": 2, "batch_size": args.batch, "epochs": 1000, "max_steps": args.steps,
        "learning_rate": 1e-3, "log_interval": 1, "validation_split": 0.0, "seed": 0,
        "zero_stage": args.zero_stage,
        "communication_data_type": None if dtype == "fp32" else dtype,
    }  # fmt: skip
    job = {
        "job_id": f"comm-{dtype}", "attempt": 1, "config": config,
        "model": {"path": str(model), "kind": "file", "factory": "build_model",
                  "kwargs": {"inputs": args.inputs, "width": args.width, "depth": args.depth}},
        "dataset": {"path": str(data)}, "validation_dataset": None, "resume_from": None,
        "output_dir": str(out),
    }  # fmt: skip
    job_file = root / f"{dtype}.json"
    job_file.write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACE3_DEVICE": "cpu",
           "PYTHONPATH": os.pathsep.join([str(REPO / "sdk"), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               "2", "-m", "ace3.runtime", "--job", str(job_file)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(
            f"{dtype}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    losses = {}
    for line in (out / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        values = event.get("values", {})
        if event["type"] == "metrics" and "train_loss" in values and "val_loss" not in values:
            losses[event["step"]] = values["train_loss"]
    return [losses[step] for step in sorted(losses)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--inputs", type=int, default=128)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--zero-stage", type=int, default=0, choices=(0, 1, 2, 3))
    parser.add_argument("--every", type=int, default=20, help="print every N-th step")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, data = write_inputs(root, args.samples, args.inputs, MODEL_FILE)
        curves = {dtype: run(root, model, data, dtype, args) for dtype in DTYPES}
    base = curves["fp32"]
    print(f"train_loss, 2 gloo ranks, ZeRO-{args.zero_stage}, {args.steps} steps, global batch "
          f"{args.batch}, MLP {args.inputs}-{args.width}x{args.depth}-10, AdamW lr 1e-3")  # fmt: skip
    print(f"{'step':>6} " + " ".join(f"{dtype:>12}" for dtype in DTYPES))
    for index in range(0, len(base), args.every):
        print(f"{index + 1:>6} " + " ".join(f"{curves[d][index]:>12.6f}" for d in DTYPES))
    print(f"{len(base):>6} " + " ".join(f"{curves[d][-1]:>12.6f}" for d in DTYPES))
    print()
    for dtype in DTYPES[1:]:
        curve = curves[dtype]
        diffs = [abs(a - b) for a, b in zip(curve, base, strict=True)]
        rel = [d / abs(b) for d, b in zip(diffs, base, strict=True) if b]
        worst = max(range(len(diffs)), key=diffs.__getitem__)
        print(f"{dtype} vs fp32: max |diff| {max(diffs):.3e} (step {worst + 1}), max rel "
              f"{max(rel):.3e}, mean |diff| {sum(diffs) / len(diffs):.3e}")  # fmt: skip
    for dtype in DTYPES:
        tail = curves[dtype][-10:]
        print(f"final loss {dtype}: {sum(tail) / len(tail):.6f}")


if __name__ == "__main__":
    main()

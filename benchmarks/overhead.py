"""The engine's cost per training step against a plain hand-written DDP script, side by side.

Both train the same MLP (``--inputs``-``--width``x``--depth``-10, ReLU) on the same synthetic
``.npz`` file written by this script, with the same seed, global batch, sampler, initial weights
and AdamW, on 2 gloo processes under ``torchrun``:

- **engine**: ``torchrun -m ace3.runtime --job job.json``, the entry point a worker launches, with
  the engine's defaults (``dynamic_batch_size`` on, a metrics report every 10 steps, a final
  checkpoint);
- **guard**: the same engine job with the instability guard on
  (``instability={"action": "skip"}``): its per-step all-reduce of the loss and gradient norm,
  the gradient norm itself and one host read per step (the row "instability guard on");
- **plain**: ``benchmarks/plain_ddp.py``, the loop a user would write (DDP, ``zero_grad``,
  forward, backward, ``step``; nothing else).

Each runs at two lengths (``--short`` and ``--long`` steps), alternating engine and plain,
``--repeats`` times. The time per steady-state step comes two ways, so start-up (imports, the
process group, data loading, the final checkpoint) cancels in both:

- **within the run** (the headline): the long run's output is read as it comes, and the time
  from the line of step ``--short`` to the line of step ``--long`` (the engine's progress line,
  which follows that step's metrics report; the plain script's ``step N``), over the steps
  between. On a shared 2-core machine start-up varies by a second or more from run to run,
  which this measure does not see;
- **across the two lengths**: the difference of the two runs' wall times over the difference
  of their steps (noisier, for the reason above).

``--engine-variant KEY=JSON`` (repeatable) also times the engine with that config setting,
in the same rotation, e.g. ``--engine-variant checkpoint_on_sigterm=false`` for the cost of the
preemption check (an asynchronous all-reduce of a flag per step, on by default).

Printed: the median (and fastest, slowest) of each, the ratio of the medians and the median of
each repeat's engine/plain ratio (the two runs of a repeat are adjacent in time, so the ratio
sees one machine load), and the final loss of each (the mean over the last 10 steps of the
long run, all ranks: the engine's last ``train_loss`` report). ::

    .venv/bin/python benchmarks/overhead.py [--repeats 5] [--short 50] [--long 450]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.synthetic import write_inputs  # noqa: E402

SDK = REPO / "sdk"
PLAIN = Path(__file__).resolve().parent / "plain_ddp.py"
PROCS = 2
WINDOW = 10  # the engine's default log_interval: its last report is the mean of 10 steps

# The same architecture as plain_ddp.build_model (kept in one text so the engine job reads it
# from a model file, as a user's job would).
MODEL_FILE = """
from torch import nn


def build_model(inputs=256, width=512, depth=6, classes=10):
    layers = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)
"""


def _env() -> dict[str, str]:
    threads = max(1, (os.cpu_count() or 1) // PROCS)
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "ACE3_DEVICE": "cpu",
        "PYTHONPATH": os.pathsep.join([str(SDK), os.environ.get("PYTHONPATH", "")]),
    }


# The engine's rank-0 progress line ("[rank 0] step 50 epoch 1 train_loss=...") and the plain
# script's ("step 50"), at the two marked steps.
STEP_LINE = re.compile(r"^(?:\[rank 0\] )?step (\d+)\b")


@dataclass
class Timing:
    wall: float  # seconds from starting torchrun to its exit
    marks: dict[int, float]  # step -> seconds since the start when its line was printed


def _torchrun(target: list[str], marks: tuple[int, ...], timeout: float) -> Timing:
    """Run under torchrun, reading its output as it comes to time the marked steps' lines."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(PROCS), *target]  # fmt: skip
    started = time.monotonic()
    seen: dict[int, float] = {}
    tail: collections.deque[str] = collections.deque(maxlen=60)
    with subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as process:  # fmt: skip
        assert process.stdout is not None
        for line in process.stdout:
            now = time.monotonic() - started
            tail.append(line)
            match = STEP_LINE.match(line)
            if match and int(match.group(1)) in marks:
                seen.setdefault(int(match.group(1)), now)
        returncode = process.wait(timeout=timeout)
    wall = time.monotonic() - started
    what = "the engine" if "ace3.runtime" in target else "the plain DDP script"
    if returncode != 0:
        raise RuntimeError(f"{what} failed:\n{''.join(tail)}")
    if set(marks) - set(seen):
        raise RuntimeError(f"{what} printed no line for steps {sorted(set(marks) - set(seen))}")
    return Timing(wall, seen)


# The "guard" column: the instability guard on (its per-step reductions and host read).
GUARD_SETTINGS: dict[str, Any] = {"instability": {"action": "skip"}}


def run_engine(root: Path, model: Path, data: Path, steps: int, args: argparse.Namespace,
               tag: str, overrides: dict[str, Any] | None = None) -> tuple[Timing, float]:  # fmt: skip
    """(timing, final train_loss) of one engine job (``overrides``: config settings on top)."""
    job_dir = root / f"engine-{tag}"
    job_dir.mkdir()
    job = {
        "job_id": f"overhead-{tag}",
        "config": {
            "num_gpus": PROCS,
            "batch_size": args.batch_size,
            "max_steps": steps,
            "epochs": 1,
            "validation_split": 0,
            "learning_rate": args.lr,
            "seed": args.seed,
            "log_interval": WINDOW,
            **(overrides or {}),
        },
        "model": {
            "path": str(model),
            "kwargs": {"inputs": args.inputs, "width": args.width, "depth": args.depth},
        },
        "dataset": {"path": str(data)},
        "output_dir": str(job_dir / "output"),
    }
    (job_dir / "job.json").write_text(json.dumps(job))
    timing = _torchrun(
        ["-m", "ace3.runtime", "--job", str(job_dir / "job.json")],
        _marks(args, steps),
        args.timeout,
    )
    events = [json.loads(x) for x in (job_dir / "output" / "events.jsonl").read_text().splitlines()]
    losses = [e for e in events if e["type"] == "metrics" and "train_loss" in e["values"]]
    if losses[-1]["step"] != steps:
        raise RuntimeError(f"the engine's last report is at step {losses[-1]['step']}, not {steps}")
    return timing, float(losses[-1]["values"]["train_loss"])


def run_plain(root: Path, data: Path, steps: int, args: argparse.Namespace,
              tag: str) -> tuple[Timing, float]:  # fmt: skip
    out = root / f"plain-{tag}.json"
    marks = _marks(args, steps)
    timing = _torchrun(
        [str(PLAIN), "--data", str(data), "--steps", str(steps),
         "--batch-size", str(args.batch_size), "--width", str(args.width),
         "--depth", str(args.depth), "--lr", str(args.lr), "--seed", str(args.seed),
         "--window", str(WINDOW), "--out", str(out),
         "--print-steps", *[str(m) for m in marks]],
        marks,
        args.timeout,
    )  # fmt: skip
    result = json.loads(out.read_text())
    return timing, float(result["final_loss"])


def _marks(args: argparse.Namespace, steps: int) -> tuple[int, ...]:
    """The steps whose lines a run of ``steps`` steps is timed at."""
    return (args.short, args.long) if steps == args.long else (args.short,)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--short", type=int, default=50)
    parser.add_argument("--long", type=int, default=450)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--inputs", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--engine-variant", action="append", default=[], metavar="KEY=JSON",
                        help="also time the engine with this config setting")  # fmt: skip
    args = parser.parse_args(argv)
    variants: dict[str, dict[str, Any]] = {}
    for text in args.engine_variant:
        key, _, value = text.partition("=")
        variants[f"engine[{text}]"] = {key: json.loads(value)}
    if args.long <= args.short or args.long % WINDOW or args.short % WINDOW:
        parser.error(f"--short < --long, both multiples of {WINDOW}")
    import torch

    print(
        f"model: MLP {args.inputs}-{args.width}x{args.depth}-10, global batch {args.batch_size}, "
        f"AdamW lr {args.lr}, {PROCS} gloo processes; {args.short} and {args.long} steps, "
        f"{args.repeats} repeat(s)"
    )
    print(f"{os.cpu_count()} CPU(s), torch {torch.__version__}, Python {platform.python_version()}")
    # Two estimates per run pair: within the long run, from the line of step --short to the line
    # of step --long (start-up is outside it); and across the two runs' wall times.
    names = ("engine", "guard", "plain", *variants)
    overrides = {"guard": GUARD_SETTINGS, **variants}
    within: dict[str, list[float]] = {name: [] for name in names}
    across: dict[str, list[float]] = {name: [] for name in names}
    final: dict[str, float] = {}
    span = args.long - args.short
    with tempfile.TemporaryDirectory(prefix="ace3-overhead-") as scratch:
        root = Path(scratch)
        model, data = write_inputs(root, args.batch_size * (args.long + 1), args.inputs, MODEL_FILE)
        for repeat in range(args.repeats):
            for name in names:
                timings: dict[int, Timing] = {}
                for steps in (args.short, args.long):
                    tag = f"{repeat}-{steps}"
                    if name == "plain":
                        timings[steps], loss = run_plain(root, data, steps, args, tag)
                    else:
                        timings[steps], loss = run_engine(
                            root, model, data, steps, args, f"{names.index(name)}-{tag}",
                            overrides.get(name),
                        )  # fmt: skip
                    if steps == args.long:
                        final[name] = loss
                long_run = timings[args.long]
                within[name].append((long_run.marks[args.long] - long_run.marks[args.short]) / span)
                across[name].append((long_run.wall - timings[args.short].wall) / span)
                print(f"  repeat {repeat + 1} {name}: {within[name][-1] * 1e3:.2f} ms/step within "
                      f"the run, {across[name][-1] * 1e3:.2f} across the two lengths", flush=True)  # fmt: skip
    table = names[:3]  # engine, guard, plain; the --engine-variant ones are printed below
    engine, guarded, plain = (statistics.median(within[n]) for n in table)
    engine_across, guard_across, plain_across = (statistics.median(across[n]) for n in table)
    rows: list[tuple[str, Any, Any, Any]] = [
        ("ms/step (median)", f"{engine * 1e3:.2f}", f"{guarded * 1e3:.2f}", f"{plain * 1e3:.2f}"),
        *[
            (
                f"ms/step ({label})",
                *(f"{pick(within[name]) * 1e3:.2f}" for name in table),
            )
            for label, pick in (("fastest", min), ("slowest", max))
        ],
        (
            "ms/step, two lengths",
            f"{engine_across * 1e3:.2f}",
            f"{guard_across * 1e3:.2f}",
            f"{plain_across * 1e3:.2f}",
        ),
        ("final train_loss", *(f"{final[name]:.5f}" for name in table)),
    ]
    print()
    print(f"{'':24}{'engine':>10}{'guard on':>10}{'plain DDP':>12}")
    for label, a, g, b in rows:
        print(f"{label:24}{a:>10}{g:>10}{b:>12}")
    guard_paired = statistics.median(
        g / e for g, e in zip(within["guard"], within["engine"], strict=True)
    )
    print(
        f"instability guard on: {(guarded - engine) * 1e3:+.2f} ms/step over the engine "
        f"({(guarded / engine - 1) * 100:+.1f}%; median of the paired ratios {guard_paired:.3f})"
    )
    # Each repeat runs the engine and the plain script one after the other: their ratio sees
    # the same load on the shared machine, which drifts between repeats by more than the
    # difference measured.
    paired = statistics.median(
        e / p for e, p in zip(within["engine"], within["plain"], strict=True)
    )
    print(
        f"engine / plain: {engine / plain:.3f} ({(engine / plain - 1) * 100:+.1f}% per step); "
        f"median of the {args.repeats} paired ratios {paired:.3f}; from the two lengths' wall "
        f"times {engine_across / plain_across:.3f}"
    )
    for name in variants:
        median = statistics.median(within[name])
        paired = statistics.median(
            v / e for v, e in zip(within[name], within["engine"], strict=True)
        )
        print(
            f"{name}: {median * 1e3:.2f} ms/step (median; fastest {min(within[name]) * 1e3:.2f}), "
            f"final train_loss {final[name]:.5f}; engine / {name}: {engine / median:.3f}, "
            f"median of the paired ratios {1 / paired:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

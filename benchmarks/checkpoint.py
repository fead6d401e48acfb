"""The training pause of a synchronous checkpoint save against an asynchronous one
(``async_save=True``), on the same training state, side by side in one run.

The state is what the engine saves for a data-parallel job: the model's state dict and an
AdamW optimizer's state (after one step, so ``exp_avg`` / ``exp_avg_sq`` exist) of a stack of
``--layers`` ``nn.Linear(--width, --width)`` layers (default 8 x 2048 x 2048: 33.6 M parameters,
about 403 MB of state), on ``--device``. Both paths are the engine's own:

- synchronous: :func:`ace3.runtime.checkpoint.files.save_atomic` (``torch.save`` to a temporary
  file, fsync, rename) -- the training waits for all of it;
- asynchronous: :meth:`ace3.runtime.checkpoint.background.BackgroundWriter.submit_state` --
  the training waits only for the staging copy into CPU memory, then the same
  ``save_atomic`` runs in a background thread (its duration is printed too: the file is
  recorded once it ends).

Each is repeated ``--repeats`` times alternately (median and range printed); between
repeats the background write is waited for, so one never overlaps the next. After the
table, ``--steps`` training steps are timed while a background save runs and without one
(what the write costs the training that goes on meanwhile)::

    .venv/bin/python benchmarks/checkpoint.py [--layers 8] [--width 2048] [--repeats 5]
                                              [--device cpu|cuda] [--dir DIRECTORY]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ace3.runtime.checkpoint.background import BackgroundWriter
from ace3.runtime.checkpoint.files import save_atomic


def build(layers: int, width: int, device: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step(model, optimizer, width, device)
    return model, optimizer


def step(model: nn.Module, optimizer: torch.optim.Optimizer, width: int, device: str) -> None:
    inputs = torch.randn(64, width, device=device)
    model(inputs).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()


def payload(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1}


def state_bytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(v) for v in state)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    model, optimizer = build(args.layers, args.width, args.device)
    size_mb = state_bytes(payload(model, optimizer)) / 1e6
    directory = args.dir or Path(tempfile.mkdtemp(prefix="ace3-ckpt-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    writer = BackgroundWriter()
    sync_pause, async_pause, async_write = [], [], []
    for i in range(args.repeats):
        path = directory / f"sync-{i}.pt"
        start = time.perf_counter()
        save_atomic(payload(model, optimizer), path)
        sync_pause.append(time.perf_counter() - start)
        path.unlink()
        path = directory / f"async-{i}.pt"
        start = time.perf_counter()
        writer.submit_state(payload(model, optimizer), path)
        async_pause.append(time.perf_counter() - start)
        writer.wait()
        async_write.append(time.perf_counter() - start)
        path.unlink()
    # Training steps while a background save runs, and without one.
    start = time.perf_counter()
    for _ in range(args.steps):
        step(model, optimizer, args.width, args.device)
    alone = (time.perf_counter() - start) / args.steps
    path = directory / "overlap.pt"
    writer.submit_state(payload(model, optimizer), path)
    start = time.perf_counter()
    for _ in range(args.steps):
        step(model, optimizer, args.width, args.device)
    overlapped = (time.perf_counter() - start) / args.steps
    writer.wait()
    path.unlink()

    def row(label: str, values: list[float]) -> str:
        med = statistics.median(values) * 1e3
        return f"{label:<34} {med:>10.1f} {min(values) * 1e3:>10.1f} {max(values) * 1e3:>10.1f}"

    print(
        f"state: {args.layers} x Linear({args.width}, {args.width}) + AdamW state = "
        f"{size_mb:.0f} MB on {args.device}; torch {torch.__version__}; files in {directory}"
    )
    print(f"{'ms (median, fastest, slowest)':<34} {'median':>10} {'min':>10} {'max':>10}")
    print(row("synchronous save: training pause", sync_pause))
    print(row("async_save: training pause", async_pause))
    print(row("async_save: file complete after", async_write))
    ratio = statistics.median(sync_pause) / statistics.median(async_pause)
    print(f"pause ratio (synchronous / async_save): {ratio:.1f}x")
    print(
        f"training step: {alone * 1e3:.1f} ms alone, {overlapped * 1e3:.1f} ms while a "
        "background save runs"
    )


if __name__ == "__main__":
    main()

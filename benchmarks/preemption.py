"""The per-step cost of the preemption check (:mod:`ace3.runtime.loop.preemption`), side by side, on
2 gloo processes: a stand-in step (a fixed matrix product, ``--step-ms`` of work) run

- **plain**: nothing else;
- **async (the engine's)**: :meth:`Preemption.step_end` itself: wait for the all-reduce issued
  one step earlier on its own gloo group, read it, issue the next;
- **blocking**: a synchronous all-reduce of the flag every step (what the engine avoids).

Printed: the median time per step of each over ``--repeats`` rounds of ``--steps`` steps, and
the difference to plain. The full engine against plain DDP, with and without the check:
``benchmarks/overhead.py --engine-variant checkpoint_on_sigterm=false``. ::

    .venv/bin/python benchmarks/preemption.py [--steps 300] [--repeats 5] [--size 192]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sdk"))


def _rank(rank: int, args: argparse.Namespace, port: int, out: dict[str, list[float]]) -> None:
    from ace3.config import TrainingConfig
    from ace3.runtime.loop.preemption import Preemption
    from ace3.runtime.process.distributed import DistContext

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ctx = DistContext(rank, rank, 2, "gloo", torch.device("cpu"))
    check = Preemption(TrainingConfig(), ctx, in_process=True)
    check.group = dist.new_group(backend="gloo")
    loop = SimpleNamespace(state=SimpleNamespace(batch_in_epoch=0), batches_per_epoch=10**9)
    a = torch.randn(args.size, args.size)
    flag = torch.zeros(1)

    def step() -> None:
        b = a @ a
        dist.all_reduce(b[:1, :1])  # (a step's own collective, as DDP's)

    variants = {
        "plain": lambda: None,
        "async (engine)": lambda: check.step_end(loop),  # type: ignore[arg-type]
        "blocking": lambda: dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=check.group),
    }
    for _ in range(args.repeats):
        for name, extra in variants.items():
            dist.barrier()
            started = time.perf_counter()
            for _ in range(args.steps):
                step()
                extra()
            elapsed = (time.perf_counter() - started) / args.steps
            check._drain()
            if rank == 0:
                out.setdefault(name, []).append(elapsed)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", type=int, default=192, help="the stand-in step's matrix size")
    args = parser.parse_args(argv)
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_run, args=(args, port, out), nprocs=2, join=True)
        shared: dict[str, list[float]] = dict(out)
    plain = statistics.median(shared["plain"])
    print(f"2 gloo processes, {args.steps} steps x {args.repeats} rounds, {os.cpu_count()} CPU(s)")
    print(f"{'variant':<18}{'ms/step':>10}{'vs plain (us)':>16}")
    for name, times in shared.items():
        median = statistics.median(times)
        print(f"{name:<18}{median * 1e3:>10.3f}{(median - plain) * 1e6:>16.1f}")
    return 0


def _run(rank: int, args: argparse.Namespace, port: int, out: object) -> None:
    local: dict[str, list[float]] = {}
    _rank(rank, args, port, local)
    if rank == 0:
        for key, value in local.items():
            out[key] = value  # type: ignore[index]


if __name__ == "__main__":
    raise SystemExit(main())

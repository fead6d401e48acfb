"""The training loop a user would write by hand: DDP, AdamW, cross-entropy, under torchrun.

The baseline of ``benchmarks/overhead.py``. It trains the same MLP on the same ``.npz`` file as
the engine, with the same seed, global batch, sampler and initial weights, so both runs see the
same samples in the same order and should end at the same loss. Nothing but the loop: no
metrics reports, no checkpoints, no host reads of the loss until the end (the losses stay on the
device and are read once). Run by ``overhead.py``::

    torchrun --nproc-per-node 2 benchmarks/plain_ddp.py --data data.npz --steps 200 --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build_model(inputs: int, width: int, depth: int, classes: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--window", type=int, default=10, help="steps in the final loss")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--print-steps", type=int, nargs="*", default=[],
                        help="rank 0 prints 'step N' after these steps (timing marks)")  # fmt: skip
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with np.load(args.data) as arrays:
        inputs = torch.from_numpy(arrays["inputs"])
        targets = torch.from_numpy(arrays["targets"])
    dataset = TensorDataset(inputs, targets)
    torch.manual_seed(args.seed)  # the same initial weights on every rank (and as the engine)
    model = build_model(inputs.shape[1], args.width, args.depth, int(targets.max()) + 1)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=False)  # fmt: skip
    per_rank = args.batch_size // world
    losses: list[torch.Tensor] = []
    epoch = 0
    while len(losses) < args.steps:
        sampler.set_epoch(epoch)
        loader = DataLoader(dataset, batch_size=per_rank, sampler=sampler,
                            generator=torch.Generator().manual_seed(args.seed + epoch))  # fmt: skip
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            if rank == 0 and len(losses) in args.print_steps:
                print(f"step {len(losses)}", flush=True)  # (CPU: the step has completed)
            if len(losses) == args.steps:
                break
        epoch += 1
    # The mean over the last ``window`` steps and all ranks: what the engine's last
    # train_loss report holds.
    final = torch.stack(losses[-args.window :]).mean()
    dist.all_reduce(final)
    if rank == 0:
        args.out.write_text(json.dumps({"final_loss": final.item() / world, "steps": len(losses)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Gloo's worker threads can outlive destroy_process_group and abort the interpreter's
    # finalization now and then (SIGABRT); the engine's entry point leaves the same way.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

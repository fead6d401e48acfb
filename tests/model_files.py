"""Model files shared by tests that run them as jobs (written to disk, uploaded or named in a
job.json)."""

# Rank 1 asks the real CPU allocator for ~9 TB when a training batch is larger than `limit`,
# from its forward pass number `after + 1` on: out of memory on one rank only.
OOM_ON_RANK_1_MODEL_FILE = """
import os

import torch
from torch import nn


class OomOnRank1(nn.Module):
    # Asks the real CPU allocator for ~9 TB on rank 1 when a batch is larger than `limit`,
    # from its training forward pass number `after + 1` on.
    def __init__(self, limit, after):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.limit, self.after, self.forwards = limit, after, 0

    def forward(self, x):
        if self.training:
            self.forwards += 1
            if (os.environ.get("RANK") == "1" and x.shape[0] > self.limit
                    and self.forwards > self.after):
                torch.empty(9 * 2**40, dtype=torch.uint8)
        return self.net(x)


def build_model(limit=1_000_000, after=0):
    torch.manual_seed(0)
    return OomOnRank1(limit, after)
"""

# The instability guard's model: on rank `rank` (the RANK environment variable; 0 for a
# one-process run) the training output becomes NaN at forward pass `nan_at` and 100 times
# larger (a loss spike) at forward pass `spike_at` (one forward pass per optimizer step when
# gradient_accumulation_steps is 1). Forward passes keep counting across a rollback, so the
# replayed steps are clean.
UNSTABLE_MODEL_FILE = """
import os

import torch
from torch import nn


class Unstable(nn.Module):
    def __init__(self, nan_at, spike_at, rank, inputs, classes):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, 16), nn.ReLU(), nn.Linear(16, classes))
        self.nan_at, self.spike_at, self.rank, self.forwards = nan_at, spike_at, rank, 0

    def forward(self, x):
        out = self.net(x)
        if self.training and int(os.environ.get("RANK", "0")) == self.rank:
            self.forwards += 1
            if self.forwards == self.nan_at:
                out = out * float("nan")
            elif self.forwards == self.spike_at:
                out = out * 100.0
        return out


def build_model(nan_at=0, spike_at=0, rank=1, inputs=8, classes=3):
    torch.manual_seed(0)
    return Unstable(nan_at, spike_at, rank, inputs, classes)
"""

# A small digits classifier (64 inputs, 10 classes) whose training forward passes sleep
# `delay` seconds each: a run that lasts long enough to be interrupted mid-epoch.
SLOW_STEP_MODEL_FILE = """
import time

import torch
from torch import nn


class SlowStep(nn.Module):
    def __init__(self, delay):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        self.delay = delay

    def forward(self, x):
        if self.training:
            time.sleep(self.delay)
        return self.net(x)


def build_model(delay=0.05):
    torch.manual_seed(0)
    return SlowStep(delay)
"""

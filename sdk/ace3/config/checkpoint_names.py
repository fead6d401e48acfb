"""The names the engine gives the checkpoints of a run (torch-free: the worker and the SDK read
them too): ``step-XXXXXXXX.pt`` for a plain checkpoint, ``step-XXXXXXXX.dcp.tar`` for a sharded
one, the step zero-padded to at least eight digits."""

from __future__ import annotations

import re

CHECKPOINT_NAME_RE = re.compile(r"\Astep-([0-9]{8,})\.(?:pt|dcp\.tar)\Z")

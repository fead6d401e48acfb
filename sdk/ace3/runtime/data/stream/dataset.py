"""The streamed dataset a rank's DataLoader iterates: :class:`ShardStream`.

Each DataLoader worker of each rank is one reader of the split (``reader = rank * W + worker``
of ``R * W``, W = ``max(1, num_workers)``); it reads its share of the shards
(:mod:`.assignment`) through its shuffle buffer (:mod:`.buffer`), asking the worker for each
shard before it opens it (:mod:`.waiting`). Iterating it in the main process (no worker) reads
as worker 0.

Epochs:

- training with every shard's sample count known and ``cycle=False``: an epoch is the loop's
  (:meth:`ShardStream.set_epoch`); every reader gives out the same number of samples, the most
  any reader holds in any planned epoch (a shorter share is read again from its start), so
  every rank runs :meth:`ShardStream.batches_per_epoch` batches, all of them;
- training with ``cycle=True``: endless; each reader goes on to its share of the next epoch by
  itself (the loop stops at ``max_steps``);
- validation: one pass over each reader's share, in the manifest's order, no wrap (``cycle``
  is ignored).

State (torchdata's ``StatefulDataLoader`` protocol, taken in each worker's copy): the reader's
:class:`~.reader.Position`. A state saved in another epoch than the one the loop sets is
ignored by a non-cycling stream (that epoch starts from its beginning); one saved by another
reader (another world size or ``num_workers``) is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

from torch.utils.data import IterableDataset, get_worker_info

from ace3.config import TrainingConfig
from ace3.config.shards import request_file_name
from ace3.runtime.data.stream.assignment import ShardPlan
from ace3.runtime.data.stream.collate import stream_collate
from ace3.runtime.data.stream.formats import ShardFormat
from ace3.runtime.data.stream.reader import STATE_VERSION, Position, Reader
from ace3.runtime.data.stream.waiting import ENGINE, RequestFile
from ace3.runtime.job_spec import DatasetSpec


class ShardStream(IterableDataset[Any]):
    #: whether a jsonl stream's samples are text records (:mod:`.text`), not (inputs, targets)
    reads_records: ClassVar[bool] = False

    def __init__(
        self,
        spec: DatasetSpec,
        *,
        split: Literal["train", "validation"],
        files: list[str],
        config: TrainingConfig,
        rank: int,
        world_size: int,
        cycle: bool,
    ) -> None:
        stream = spec.stream
        if stream is None:
            raise ValueError(f"{spec.path}: not a streamed dataset (its spec has no stream)")
        if not files:
            raise ValueError(f"the {split} split of {spec.path} has no shards")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not one of world_size={world_size}")
        known = {shard.file: index for index, shard in enumerate(stream.shards)}
        unknown = [name for name in files if name not in known]
        if unknown:
            raise ValueError(f"{spec.path}: {unknown[0]!r} is not one of the stream's shards")
        self.split = split
        self.rank = rank
        self.world_size = world_size
        self.directory = Path(spec.path)
        self.requests = stream.requests
        self.files = list(files)
        self.manifest_index = [known[name] for name in files]
        self.position_of = {m: position for position, m in enumerate(self.manifest_index)}
        shards = [stream.shards[m] for m in self.manifest_index]
        self.sizes = [shard.size for shard in shards]
        self.format = ShardFormat(stream, config.sequence_length, records=self.reads_records)
        self.collate_fn: Callable[[list[Any]], Any] = stream_collate  # (the loaders' collate_fn)
        counts = [self.format.count(shard.size, shard.samples) for shard in shards]
        train = split == "train"
        self.cycle = cycle and train
        self.shuffle = config.shuffle and train
        self.seed = config.seed
        self.buffer_size = config.shuffle_buffer if self.shuffle else 0
        self.workers = max(1, config.num_workers)
        readers = world_size * self.workers
        self.plan = ShardPlan(
            counts, self.sizes, readers, config.seed, self.shuffle, fill_empty=train
        )
        if self.plan.counts is not None and not sum(self.plan.counts):
            raise ValueError(
                f"the {split} split of {spec.path} holds no samples"
                + (
                    " (tokens: every shard is shorter than sequence_length + 1 tokens)"
                    if stream.format == "tokens"
                    else ""
                )
            )
        self.wrap_to = None if self.cycle or not train else self.plan.longest(config.epoch_count)
        if rank == 0 and readers > len(files):
            ENGINE.info(
                f"{split} data: {readers} readers ({world_size} ranks x {self.workers} loader "
                f"workers) for {len(files)} shards: "
                + ("some repeat another's shards" if train else "some read none")
            )
        self.epoch = 0
        self._pending: dict[str, Any] | None = None
        self._live: Reader | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A copy for a DataLoader worker: without a reader the main process may have run."""
        state = dict(self.__dict__)
        state["_live"] = None
        return state

    def set_epoch(self, epoch: int) -> None:
        """The loop's epoch (a non-cycling stream's shard order and buffer follow it; a cycling
        stream starts there unless a state is loaded)."""
        self.epoch = epoch

    def samples_per_reader(self, epoch: int) -> list[int] | None:
        """Each reader's samples in ``epoch`` (its share, before any wrap), for the ``R * W``
        readers; None when a shard's count is unknown."""
        return self.plan.samples_per_reader(epoch)

    def batches_per_epoch(self, per_rank_batch: int) -> int | None:
        """Batches each rank's loader gives in every epoch: ``W * ceil(wrap_to / batch)``; None
        for a cycling stream, validation, or unknown counts."""
        if self.wrap_to is None:
            return None
        return self.workers * math.ceil(self.wrap_to / per_rank_batch)

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        if info is not None and info.num_workers != self.workers:
            raise ValueError(
                f"the {self.split} stream was planned for num_workers={self.workers} loader "
                f"workers, but its DataLoader has {info.num_workers}"
            )
        reader = self.rank * self.workers + worker
        pending, self._pending = self._pending, None
        request = RequestFile(self.requests, request_file_name(self.split, self.rank, worker))
        self._live = Reader(self, self._start(pending, reader), request)
        return self._live.run()

    def _start(self, state: dict[str, Any] | None, reader: int) -> Position:
        readers = self.world_size * self.workers
        if state is None or "cursor" not in state:
            epoch = int(state["epoch"]) if state is not None and self.cycle else self.epoch
            return Position(epoch, reader, readers)
        position = Position.from_state(state)
        if (position.reader, position.readers) != (reader, readers):
            raise ValueError(
                f"the {self.split} data position was saved by reader {position.reader} of "
                f"{position.readers}, and this is reader {reader} of {readers}: resume a stream "
                "with the same number of ranks and num_workers"
            )
        if not self.cycle and position.epoch != self.epoch:
            return Position(self.epoch, reader, readers)
        if self.cycle and position.finished:
            return Position(position.epoch + 1, reader, readers)
        return position

    def state_dict(self) -> dict[str, Any]:
        if self._live is not None:
            return self._live.state()
        if self._pending is not None:
            return dict(self._pending)
        return {"version": STATE_VERSION, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"not a stream reader's state (version {state.get('version')!r}, "
                f"expected {STATE_VERSION})"
            )
        self._pending = dict(state)
        self._live = None

"""Streamed (sharded) datasets on the engine side: the shards the worker brings into a job's
directory, read by each DataLoader worker of each rank (:class:`ShardStream`).

- :mod:`.formats` (and :mod:`.webdataset`): one shard's samples, from any sample on;
- :mod:`.assignment`: which reader reads which shards, per epoch; the validation hold-out;
- :mod:`.buffer`: the shuffle buffer; :mod:`.waiting`: request files, waiting for shards;
- :mod:`.reader`: one reader's pass and its position; :mod:`.dataset`: the IterableDataset;
- :mod:`.collate`: batches.
"""

from ace3.runtime.data.stream.assignment import split_shards
from ace3.runtime.data.stream.collate import stream_collate
from ace3.runtime.data.stream.dataset import ShardStream

__all__ = ["ShardStream", "split_shards", "stream_collate"]

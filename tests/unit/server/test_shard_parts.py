"""The parts a shard's presigned multipart upload is cut into: ``ACE3_SHARD_PART_BYTES`` each,
the last one the rest, never more than S3's 10,000 parts."""

from __future__ import annotations

from ace3_server.services.shard_store import part_sizes
from ace3_server.shard_schemas import MAX_PARTS


def test_parts_are_the_part_size_and_the_rest() -> None:
    assert part_sizes(1, 5) == [1]
    assert part_sizes(10, 5) == [5, 5]
    assert part_sizes(11, 5) == [5, 5, 1]


def test_a_shard_never_needs_more_parts_than_s3_allows() -> None:
    sizes = part_sizes(MAX_PARTS * 7 + 3, 5)
    assert len(sizes) <= MAX_PARTS and sum(sizes) == MAX_PARTS * 7 + 3
    assert len(set(sizes[:-1])) == 1 and sizes[-1] <= sizes[0]

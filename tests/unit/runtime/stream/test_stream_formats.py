"""Each streamed format reads its shards back exactly, from any sample on, and a bad shard is an
error naming the file (and the line)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ace3.runtime.data.stream.formats import ShardFormat
from ace3.runtime.job_spec import StreamSpec
from tests.stream_shards import npy_bytes, write_jsonl, write_parquet, write_tar, write_tokens


def shard_format(format: str, sequence_length: int | None = None, **fields: object) -> ShardFormat:
    spec = StreamSpec.model_validate(
        {"format": format, "shards": [{"file": "x", "size": 1}], "requests": "/r", **fields}
    )
    return ShardFormat(spec, sequence_length)


def test_parquet_rows_come_back_with_list_columns_as_a_dimension(tmp_path: Path) -> None:
    inputs = [[float(i), float(i) + 0.5] for i in range(10)]
    path = write_parquet(tmp_path / "000000.parquet", inputs, list(range(10)), row_group_size=3)
    reader = shard_format("parquet")
    samples = list(reader.samples(path))
    assert len(samples) == 10
    x, y = samples[7]
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert x.tolist() == [7.0, 7.5] and y.item() == 7
    # from row 5 (inside the second row group of 3): the same samples
    assert [int(y) for _, y in reader.samples(path, 5)] == list(range(5, 10))
    assert sorted(reader.take(path, [9, 1, 4])) == [1, 4, 9]
    assert int(reader.take(path, [4])[4][1]) == 4


def test_parquet_starts_at_the_row_group_that_holds_the_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    path = write_parquet(tmp_path / "000000.parquet", [[1.0]] * 12, [0] * 12, row_group_size=4)
    read: list[int] = []
    original = pq.ParquetFile.read_row_group

    def counting(self: pq.ParquetFile, group: int, *args: object, **kwargs: object) -> object:
        read.append(group)
        return original(self, group, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counting)
    assert len(list(shard_format("parquet").samples(path, 9))) == 3
    assert read == [2]


def test_parquet_columns_are_renamed_and_bools_become_float(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "000000.parquet"
    pq.write_table(pa.table({"text": [[1, 2], [3, 4]], "flag": [True, False]}), path)
    reader = shard_format("parquet", columns={"inputs": "text", "targets": "flag"})
    (x0, y0), (_, y1) = reader.samples(path)
    assert x0.tolist() == [1, 2] and x0.dtype == torch.int64
    assert y0.dtype == torch.float32 and (y0.item(), y1.item()) == (1.0, 0.0)


def test_jsonl_plain_gzip_and_zstd_read_the_same(tmp_path: Path) -> None:
    records = [{"inputs": [i, i + 1.5], "label": i % 3} for i in range(7)]
    for name in ("000000.jsonl", "000001.jsonl.gz", "000002.jsonl.zst"):
        path = write_jsonl(tmp_path / name, [records[0], "", *records[1:]])
        samples = list(shard_format("jsonl").samples(path))
        assert [x.tolist() for x, _ in samples] == [r["inputs"] for r in records]
        assert [y.item() for _, y in samples] == [r["label"] for r in records]
        assert samples[0][0].dtype == torch.float32 and samples[0][1].dtype == torch.int64
        assert [y.item() for _, y in shard_format("jsonl").samples(path, 4)] == [1, 2, 0]


def test_tokens_are_windows_of_length_plus_one_at_stride_length(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "000000.bin", range(100, 114), dtype="uint32")
    reader = shard_format("tokens", dtype="uint32", sequence_length=4)
    assert reader.count(path.stat().st_size, None) == 3  # (14 - 1) // 4
    samples = list(reader.samples(path))
    assert [s["input_ids"].tolist() for s in samples] == [
        [100, 101, 102, 103],
        [104, 105, 106, 107],
        [108, 109, 110, 111],
    ]
    assert samples[1]["labels"].tolist() == [105, 106, 107, 108]
    assert samples[0]["input_ids"].dtype == torch.int64
    assert [s["labels"].tolist() for s in reader.samples(path, 2)] == [[109, 110, 111, 112]]
    assert reader.take(path, [2, 0])[2]["input_ids"].tolist() == [108, 109, 110, 111]


def test_tokens_for_a_model_that_shifts_its_labels_give_the_input_ids_as_labels(
    tmp_path: Path,
) -> None:
    path = write_tokens(tmp_path / "000000.bin", range(100, 114), dtype="uint32")
    reader = shard_format("tokens", dtype="uint32", sequence_length=4, labels="inputs")
    samples = list(reader.samples(path))
    assert [s["labels"].tolist() for s in samples] == [s["input_ids"].tolist() for s in samples]
    assert samples[1]["labels"].tolist() == [104, 105, 106, 107]
    assert reader.take(path, [2])[2]["labels"].tolist() == [108, 109, 110, 111]


def test_webdataset_groups_members_by_key_and_decodes_by_extension(tmp_path: Path) -> None:
    from PIL import Image

    image = Image.new("RGB", (3, 2), (10, 20, 30))
    png = __import__("io").BytesIO()
    image.save(png, format="PNG")
    members = []
    for i in range(3):
        members += [
            (f"part/{i:04d}.npy", npy_bytes(np.full((2,), i, dtype=np.float64))),
            (f"part/{i:04d}.cls", str(i).encode()),
            (f"part/{i:04d}.json", json.dumps({"i": i}).encode()),
            (f"part/{i:04d}.txt", f"text {i}".encode()),
            (f"part/{i:04d}.seg.png", png.getvalue()),
        ]
    path = write_tar(tmp_path / "000000.tar", members)
    samples = list(shard_format("webdataset").samples(path))
    assert len(samples) == 3
    sample = samples[2]
    assert set(sample) == {"npy", "cls", "json", "txt", "seg.png"}
    assert sample["npy"].dtype == torch.float32 and sample["npy"].tolist() == [2.0, 2.0]
    assert sample["cls"].dtype == torch.int64 and sample["cls"].item() == 2
    assert sample["json"] == {"i": 2} and sample["txt"] == "text 2"
    assert sample["seg.png"].shape == (3, 2, 3) and sample["seg.png"].dtype == torch.uint8
    assert sample["seg.png"][:, 0, 0].tolist() == [10, 20, 30]
    assert [s["cls"].item() for s in shard_format("webdataset").samples(path, 1)] == [1, 2]


def test_corrupt_parquet_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "000003.parquet"
    path.write_bytes(b"PAR1 this is not parquet at all")
    with pytest.raises(ValueError, match=r"000003\.parquet: not a readable parquet file"):
        list(shard_format("parquet").samples(path))


def test_parquet_without_the_columns_names_them(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "000000.parquet"
    pq.write_table(pa.table({"a": [1]}), path)
    with pytest.raises(ValueError, match=r"000000\.parquet: no column 'inputs'"):
        list(shard_format("parquet").samples(path))


def test_a_jsonl_line_that_is_not_json_names_its_line(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "000001.jsonl.gz", [{"inputs": [1], "target": 0}, "", "{not json"]
    )
    with pytest.raises(ValueError, match=r"000001\.jsonl\.gz: line 3 is not valid JSON"):
        list(shard_format("jsonl").samples(path))


def test_a_truncated_compressed_jsonl_names_the_file(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "000001.jsonl.gz", [{"inputs": [i], "target": 0} for i in range(99)]
    )
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match=r"000001\.jsonl\.gz: unreadable"):
        list(shard_format("jsonl").samples(path))


def test_a_tokens_file_of_a_partial_token_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "000002.bin"
    path.write_bytes(b"\x01\x00\x02\x00\x03")
    with pytest.raises(ValueError, match=r"000002\.bin: 5 bytes is not a whole number of uint16"):
        list(shard_format("tokens", sequence_length=1).samples(path))


def test_tokens_without_a_sequence_length_is_refused() -> None:
    with pytest.raises(ValueError, match=r"sequence_length"):
        shard_format("tokens")


def test_a_corrupt_tar_names_the_file(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "000004.tar", [("a.cls", b"1")] * 3)
    path.write_bytes(path.read_bytes()[:700])
    with pytest.raises(ValueError, match=r"000004\.tar"):
        list(shard_format("webdataset").samples(path))

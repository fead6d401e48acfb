"""Text records in a sharded (streamed) jsonl dataset, for a Hugging Face model.

The kind is the one the dataset named (``records=``, ``DatasetSpec.records``), else the kind
of the first record of the manifest's first shard (every rank reads the same one, so every
rank decides alike; :func:`stream_records_kind`). Each rank then tokenizes only the records of
its own shards as it streams them (:class:`ace3.runtime.data.stream.text.TextShardStream`):
the same tokenizer, masking, truncation and packing as a ``.jsonl`` file's records
(:mod:`ace3.runtime.data.text_datasets`), the same batches. Like every jsonl stream its length
is unknown: it cycles for ``max_steps`` and refuses ``epochs``. Validation: a streamed
validation dataset of records, a ``.jsonl`` file of records (tokenized whole), or else whole
shards held out (10% by default, none of a single shard, none with ``validation_split=0``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

from torch.utils.data import Dataset

from ace3.config import TrainingConfig
from ace3.config.shards import request_file_name
from ace3.config.text_records import RecordKind, text_record_kind
from ace3.runtime.data.datasets import Datasets, refuse_uncounted_epochs
from ace3.runtime.data.stream import split_shards
from ace3.runtime.data.stream.formats import ShardFormat
from ace3.runtime.data.stream.text import TextSettings, TextShardStream
from ace3.runtime.data.stream.waiting import RequestFile, wait_for_file
from ace3.runtime.data.text_datasets import (
    TextData,
    default_sequence_length,
    load_tokenizer,
    pad_token_id,
    text_records_file,
    tokenized_dataset,
)
from ace3.runtime.data.text_records import chat_template_of, collate_text
from ace3.runtime.data.text_tokens import Once, tokenize_once
from ace3.runtime.job_spec import DatasetSpec


def stream_records_kind(
    spec: DatasetSpec | None, replica: int, split: Literal["train", "validation"] = "train"
) -> RecordKind | None:
    """The kind of text records a jsonl stream holds (named, or its first record's); None for
    anything else. ``replica``: this rank's data replica, whose request file asks for the
    first shard when the kind must be read from it."""
    if spec is None or spec.stream is None or spec.stream.format != "jsonl":
        return None
    if spec.records is not None:
        return spec.records
    first = spec.stream.shards[0].file
    RequestFile(spec.stream.requests, request_file_name(split, replica, 0)).write([first])
    path = Path(spec.path) / first
    wait_for_file(path, f"{split} data (reading the first record's kind)")
    samples = ShardFormat(spec.stream, None, records=True).samples(path)
    try:
        for _file, _line, record in samples:
            return text_record_kind(record)
    finally:
        samples.close()
    return None


def _streams(
    spec: DatasetSpec,
    split: Literal["train", "validation"],
    files: list[str],
    config: TrainingConfig,
    replica: tuple[int, int],
    text: TextSettings,
) -> TextShardStream:
    return TextShardStream(
        spec, split=split, files=files, config=config, rank=replica[0], world_size=replica[1],
        cycle=split == "train", text=text,
    )  # fmt: skip


def load_text_streams(
    train_spec: DatasetSpec,
    validation_spec: DatasetSpec | None,
    config: TrainingConfig,
    replica: tuple[int, int],
    model_dir: Path,
    kind: RecordKind,
    once: Once | None = None,
) -> TextData:
    """The training stream of ``kind`` records and its validation (module docstring);
    ``once``: how a validation ``.jsonl`` file is tokenized once per node."""
    assert train_spec.stream is not None
    refuse_uncounted_epochs(config)  # (a jsonl stream's rule: it cycles for max_steps)
    tokenizer = load_tokenizer(model_dir)
    if kind == "chat":
        chat_template_of(tokenizer)  # refused before any shard is read
    pad_id = pad_token_id(tokenizer)
    length = config.sequence_length or default_sequence_length(model_dir)
    settings = functools.partial(
        TextSettings, tokenizer=tokenizer, length=length, packing=config.packing, pad_id=pad_id
    )
    train_text = settings(kind=kind, named=train_spec.records is not None)
    shards = len(train_spec.stream.shards)
    notes: list[str] = []
    validation: Dataset[Any] | None = None
    files = [shard.file for shard in train_spec.stream.shards]
    if validation_spec is not None:
        validation, note = _validation(validation_spec, config, replica, settings, once)
        notes += [note] if note else []
    else:
        files, held_out = split_shards(train_spec, config)
        if held_out:
            validation = _streams(train_spec, "validation", held_out, config, replica, train_text)
            notes.append(f"validation: {len(held_out)} of the dataset's {shards} shards held out")
        elif config.validation_split != 0:
            notes.append(
                "validation: none (the streamed dataset has a single shard, which cannot be "
                "held out: give a validation dataset to validate)"
            )
    train = _streams(train_spec, "train", files, config, replica, train_text)
    notes.insert(
        0,
        f"training data: {kind.replace('_', '/')} records streamed from {len(files)} shard(s), "
        f"each rank tokenizing its own as it reads them; examples truncated to {length} tokens"
        + ("; packed" if config.packing else ""),
    )
    collate = functools.partial(collate_text, pad_token_id=pad_id)
    return TextData(Datasets(train, validation, tuple(notes)), collate, kind, tokenizer)


def _validation(
    spec: DatasetSpec,
    config: TrainingConfig,
    replica: tuple[int, int],
    settings: Any,
    once: Once | None,
) -> tuple[Dataset[Any], str | None]:
    """A validation dataset of text records: streamed, or a ``.jsonl`` file tokenized whole
    (and its note)."""
    if spec.stream is not None:
        kind = stream_records_kind(spec, replica[0], "validation")
        if kind is not None:
            files = [shard.file for shard in spec.stream.shards]
            text = settings(kind=kind, named=spec.records is not None)
            return _streams(spec, "validation", files, config, replica, text), None
    else:
        path = text_records_file(spec)
        if path is not None:
            tokenizer = settings.keywords["tokenizer"]
            kind, examples = tokenize_once(
                path, tokenizer, spec.records, once.at("validation") if once else None
            )
            text = settings(kind=kind, named=spec.records is not None)
            return tokenized_dataset(
                path.name, kind, examples, text.length, text.packing, text.pad_id
            )
    raise ValueError(
        f"{spec.path}: the validation dataset of text records for a Hugging Face model must "
        "hold text records too (a .jsonl, or jsonl shards, of chat, prompt/completion or text "
        "records)"
    )

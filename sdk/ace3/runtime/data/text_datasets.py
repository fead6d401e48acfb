"""Text records for a Hugging Face model (chat, prompt/completion or text ``.jsonl``), tokenized in
the job with the model directory's own tokenizer and chat template
(:mod:`ace3.runtime.data.text_records`): only what the model should learn to write is in the
labels. Each example is truncated to ``sequence_length`` tokens (by default the model's
``max_position_embeddings``, or ``n_positions``, at most :data:`DEFAULT_MAX_LENGTH`), or, with
``config.packing``, whole examples are packed in order into sequences of at most that many
tokens. Batches are padded dicts: ``input_ids``, ``labels`` and ``attention_mask``; packed, with
``position_ids`` that restart per example and no ``attention_mask``, from which transformers
keeps the examples of a pack apart (also with eager and sdpa attention; the model runs without
a cache, :mod:`ace3.runtime.hf_model`).

Validation comes from ``validation_dataset`` (text records too), else from holding out
``validation_split`` of the examples (10% when it is left unset), as for every other dataset.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from ace3.config import TrainingConfig
from ace3.runtime.data.datasets import DEFAULT_VALIDATION_SPLIT, Datasets, split_holdout
from ace3.runtime.data.text_records import (
    TokenizedTextDataset,
    collate_text,
    read_records,
    tokenize_records,
)
from ace3.runtime.hf_model import read_model_config
from ace3.runtime.job_spec import DatasetSpec

DEFAULT_MAX_LENGTH = 2048
_TEXT_KEYS = ("messages", "prompt", "completion", "text")


def text_records_file(spec: DatasetSpec | None) -> Path | None:
    """The ``.jsonl`` file ``spec`` names (a file, or a directory's one data file without a
    ``dataset.py``) when its first record is a text record; None otherwise."""
    if spec is None or spec.stream is not None:
        return None
    path = Path(spec.path)
    if path.is_dir():
        if (path / "dataset.py").exists():
            return None
        found = [p for p in path.iterdir() if p.suffix.lower() == ".jsonl" and p.is_file()]
        if len(found) != 1:
            return None
        path = found[0]
    if path.suffix.lower() != ".jsonl" or not path.is_file():
        return None
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError:
                    return None  # (the engine's own reader names the line)
                if not isinstance(record, dict) or "inputs" in record:
                    return None
                return path if any(key in record for key in _TEXT_KEYS) else None
    return None


def default_sequence_length(model_dir: Path) -> int:
    """The model's context (``max_position_embeddings``, or GPT-2's ``n_positions``), at most
    :data:`DEFAULT_MAX_LENGTH`."""
    config = read_model_config(model_dir)
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return min(value, DEFAULT_MAX_LENGTH)
    return DEFAULT_MAX_LENGTH


@dataclass(frozen=True)
class TextData:
    """The tokenized datasets (their notes say what was tokenized) and the collate function
    that pads their batches."""

    datasets: Datasets
    collate: Callable[[list[Any]], Any]


def _tokenized(
    path: Path, tokenizer: Any, sequence_length: int, packing: bool, pad_id: int
) -> tuple[TokenizedTextDataset, str]:
    kind, records = read_records(path)
    examples = tokenize_records(records, kind, tokenizer)
    dataset = TokenizedTextDataset(examples, sequence_length, packing, pad_id)
    report = dataset.report
    note = (
        f"{path.name}: {len(examples)} {kind.replace('_', '/')} example(s), {report.tokens:,} "
        f"tokens; {report.truncated} truncated to {sequence_length} tokens"
        + (
            f", {report.dropped} left out (nothing to learn once truncated)"
            if report.dropped
            else ""
        )
        + (f"; packed into {len(dataset)} sequence(s)" if packing else "")
        + f"; padding at most {report.padding_share:.1%} of the tokens"
    )
    return dataset, note


def load_text_datasets(
    train_file: Path,
    validation_spec: DatasetSpec | None,
    config: TrainingConfig,
    model_dir: Path,
) -> TextData:
    """Tokenize the training records (and the validation ones) with the model's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    length = config.sequence_length or default_sequence_length(model_dir)
    tokenized = functools.partial(
        _tokenized,
        tokenizer=tokenizer,
        sequence_length=length,
        packing=config.packing,
        pad_id=pad_id,
    )
    train, note = tokenized(train_file)
    notes = [note]
    validation: Dataset[Any] | None = None
    validation_file = text_records_file(validation_spec)
    if validation_spec is not None:
        if validation_file is None:
            raise ValueError(
                f"{validation_spec.path}: the validation dataset of text records for a "
                "Hugging Face model must hold text records too (a .jsonl of chat, "
                "prompt/completion or text records)"
            )
        validation, note = tokenized(validation_file)
        notes.append(note)
    else:
        fraction = config.validation_split
        if fraction is None:
            fraction = DEFAULT_VALIDATION_SPLIT
        if fraction:
            train, validation = split_holdout(train, fraction, config.seed)
    collate = functools.partial(collate_text, pad_token_id=pad_id)
    return TextData(Datasets(train, validation, tuple(notes)), collate)

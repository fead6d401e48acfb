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
``validation_split`` of the examples (10% when it is left unset) before they are packed. A
``sequence_length`` longer than the model's context is refused.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ace3.config import TrainingConfig
from ace3.config.text_records import RecordKind, text_record_kind
from ace3.runtime.data.datasets import DEFAULT_VALIDATION_SPLIT, Datasets, single_data_file
from ace3.runtime.data.text_records import (
    TextReport,
    TokenizedExample,
    TokenizedTextDataset,
    collate_text,
)
from ace3.runtime.data.text_tokens import Once, tokenize_once
from ace3.runtime.hf_model import read_model_config
from ace3.runtime.job_spec import DatasetSpec

DEFAULT_MAX_LENGTH = 2048


def text_records_file(spec: DatasetSpec | None) -> Path | None:
    """The ``.jsonl`` file ``spec`` names (a file, or a directory's one data file without a
    ``dataset.py``, by the engine's own rule) when it named its kind of text records
    (``spec.records``) or its first record is a text record; None otherwise."""
    if spec is None or spec.stream is not None:
        return None
    path = Path(spec.path)
    if path.is_dir():
        if (path / "dataset.py").exists():
            return None
        try:
            path = single_data_file(path)
        except ValueError:
            return None  # (the engine's own reader says why)
    if path.suffix.lower() != ".jsonl" or not path.is_file():
        return None
    if spec.records is not None:
        return path
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError:
                    return None  # (the engine's own reader names the line)
                return path if text_record_kind(record) is not None else None
    return None


def model_context(model_dir: Path) -> int | None:
    """The model's context in tokens (``max_position_embeddings``, or GPT-2's ``n_positions``),
    None when ``config.json`` names none."""
    config = read_model_config(model_dir)
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def default_sequence_length(model_dir: Path) -> int:
    """The model's context, at most :data:`DEFAULT_MAX_LENGTH`."""
    return min(model_context(model_dir) or DEFAULT_MAX_LENGTH, DEFAULT_MAX_LENGTH)


def check_sequence_length(model_dir: Path, sequence_length: int | None) -> None:
    """ValueError naming ``sequence_length`` when it is longer than the model's context (its
    position embeddings would be indexed past their end)."""
    context = model_context(model_dir)
    if sequence_length is not None and context is not None and sequence_length > context:
        raise ValueError(
            f"sequence_length={sequence_length} is longer than the model's context of {context} "
            "tokens (max_position_embeddings or n_positions in its config.json): use at most that"
        )


def load_tokenizer(model_dir: Path) -> Any:
    """The model directory's own tokenizer (its code runs only when the directory names it)."""
    from transformers import AutoTokenizer

    custom_code = any(
        "auto_map" in read_model_config(model_dir, name)
        for name in ("config.json", "tokenizer_config.json")
        if (model_dir / name).is_file()
    )
    return AutoTokenizer.from_pretrained(
        str(model_dir), local_files_only=True, trust_remote_code=custom_code
    )


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's padding id: its pad token, else its EOS, else 0."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    return 0


@dataclass(frozen=True)
class TextData:
    """The tokenized datasets (their notes say what was tokenized), the collate function that
    pads their batches, the training records' kind (``chat``, ``prompt_completion``, ``text``)
    and the tokenizer."""

    datasets: Datasets
    collate: Callable[[list[Any]], Any]
    kind: str
    tokenizer: Any


def text_note(name: str, kind: str, report: TextReport, length: int, packs: int | None) -> str:
    """What tokenizing ``name`` gave, for the log (``packs``: the sequences packed, if so)."""
    return (
        f"{name}: {report.examples + report.dropped} {kind.replace('_', '/')} example(s), "
        f"{report.tokens:,} tokens; {report.truncated} truncated to {length} tokens"
        + (
            f", {report.dropped} left out (nothing to learn once truncated)"
            if report.dropped
            else ""
        )
        + (f"; packed into {packs} sequence(s)" if packs is not None else "")
        + f"; padding at most {report.padding_share:.1%} of the tokens"
    )


def tokenized_dataset(
    name: str,
    kind: str,
    examples: Sequence[TokenizedExample],
    length: int,
    packing: bool,
    pad_id: int,
) -> tuple[TokenizedTextDataset, str]:
    dataset = TokenizedTextDataset(examples, length, packing, pad_id)
    packs = len(dataset) if packing else None
    return dataset, text_note(name, kind, dataset.report, length, packs)


def _held_out(
    examples: Sequence[TokenizedExample], fraction: float, seed: int
) -> tuple[list[TokenizedExample], list[TokenizedExample]]:
    """Examples held out for validation before any packing (a permutation seeded by ``seed``,
    the same on every rank), so that the fraction is of examples, not of packs."""
    count = round(len(examples) * fraction)
    if not 0 < count < len(examples):
        raise ValueError(
            f"validation_split={fraction}: {len(examples)} example(s) cannot be split so; give "
            "more records, a validation dataset, or validation_split=0"
        )
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
    held = set(order[:count])
    train = [e for i, e in enumerate(examples) if i not in held]
    return train, [e for i, e in enumerate(examples) if i in held]


def load_text_datasets(
    train_file: Path,
    validation_spec: DatasetSpec | None,
    config: TrainingConfig,
    model_dir: Path,
    records: RecordKind | None = None,
    once: Once | None = None,
) -> TextData:
    """Tokenize the training records (and the validation ones) with the model's tokenizer;
    ``records``: the kind the training dataset named (``DatasetSpec.records``); ``once``: the
    node's leader tokenizes each file for its ranks (:mod:`.text_tokens`)."""
    check_sequence_length(model_dir, config.sequence_length)
    tokenizer = load_tokenizer(model_dir)
    pad_id = pad_token_id(tokenizer)
    length = config.sequence_length or default_sequence_length(model_dir)
    build = functools.partial(
        tokenized_dataset, length=length, packing=config.packing, pad_id=pad_id
    )
    kind, examples = tokenize_once(
        train_file, tokenizer, records, once.at("train") if once else None
    )
    validation_file = text_records_file(validation_spec)
    if validation_spec is not None and validation_file is None:
        raise ValueError(
            f"{validation_spec.path}: the validation dataset of text records for a Hugging "
            "Face model must hold text records too (a .jsonl of chat, prompt/completion or "
            "text records)"
        )
    held: list[TokenizedExample] = []
    fraction = config.validation_split
    if validation_file is None:
        fraction = DEFAULT_VALIDATION_SPLIT if fraction is None else fraction
        if fraction:
            examples, held = _held_out(examples, fraction, config.seed)
    train, note = build(train_file.name, kind, examples)
    notes = [note]
    validation: Dataset[Any] | None = None
    if validation_file is not None:
        validation_kind, validation_examples = tokenize_once(
            validation_file,
            tokenizer,
            validation_spec.records if validation_spec else None,
            once.at("validation") if once else None,
        )
        validation, note = build(validation_file.name, validation_kind, validation_examples)
        notes.append(note)
    elif held:
        validation, note = build(f"{train_file.name} (held out)", kind, held)
        notes.append(note)
    collate = functools.partial(collate_text, pad_token_id=pad_id)
    return TextData(Datasets(train, validation, tuple(notes)), collate, kind, tokenizer)

"""Text records in the job (runtime/data/text_datasets.py): which datasets are text records (the
engine's own rule for a directory), validation held out by examples before packing, and a
sequence_length past the model's context refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ace3
from ace3.runtime.data.text_datasets import (
    check_sequence_length,
    load_text_datasets,
    text_records_file,
)
from ace3.runtime.job_spec import DatasetSpec

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
TEXT = "the quick brown fox jumps over the lazy dog " * 10


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("model")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    bpe.train_from_iterator([TEXT], tokenizers.trainers.BpeTrainer(vocab_size=40, special_tokens=["<unk>", "<eos>"]))  # fmt: skip
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", eos_token="<eos>"
    ).save_pretrained(str(directory))
    (directory / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 32}))
    return directory


def _records(path: Path, count: int) -> Path:
    words = TEXT.split()
    path.write_text("".join(json.dumps({"text": " ".join(words[i % 5 : i % 5 + 3])}) + "\n" for i in range(count)))  # fmt: skip
    return path


def test_a_directory_is_read_by_the_engines_rule(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    directory.mkdir()
    data = _records(directory / "train.jsonl", 3)
    (directory / "._train.jsonl").write_text("macOS metadata")  # hidden: not a data file
    assert text_records_file(DatasetSpec(path=str(directory))) == data
    (directory / "x.csv").write_text("a,target\n1,0\n")  # two data files: the engine refuses
    assert text_records_file(DatasetSpec(path=str(directory))) is None
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"inputs": [1], "target": 0}) + "\n")
    assert text_records_file(DatasetSpec(path=str(pairs))) is None


def test_validation_is_held_out_by_examples_before_packing(model_dir: Path, tmp_path: Path) -> None:
    data = _records(tmp_path / "train.jsonl", 20)
    config = ace3.TrainingConfig(packing=True, sequence_length=32, seed=0)
    text = load_text_datasets(data, None, config, model_dir)
    train, validation = text.datasets.train, text.datasets.validation
    assert validation is not None
    assert "train.jsonl: 18 text example(s)" in text.datasets.notes[0]
    assert "train.jsonl (held out): 2 text example(s)" in text.datasets.notes[1]
    assert len(train) >= 1 and len(validation) == 1  # packs of the 18 and of the 2


def test_a_sequence_length_past_the_context_is_refused(model_dir: Path) -> None:
    check_sequence_length(model_dir, 32)
    with pytest.raises(
        ValueError, match="sequence_length=33 is longer than the model's context of 32"
    ):
        check_sequence_length(model_dir, 33)


def test_a_named_kind_of_records_is_what_the_job_reads(model_dir: Path, tmp_path: Path) -> None:
    # Each record holds a text and a prompt/completion: the first record alone says
    # prompt/completion; records="text" (DatasetSpec.records, from records= at upload) says text.
    data = tmp_path / "train.jsonl"
    record = {"inputs": 1, "text": TEXT[:40], "prompt": "the quick", "completion": " brown fox"}
    data.write_text("".join(json.dumps(record) + "\n" for _ in range(4)))
    assert text_records_file(DatasetSpec(path=str(data))) is None  # ("inputs": a pair record)
    named = DatasetSpec(path=str(data), records="text")
    assert text_records_file(named) == data
    config = ace3.TrainingConfig(sequence_length=32, validation_split=0)
    text = load_text_datasets(data, named, config, model_dir, records="text")
    assert text.datasets.notes[0].startswith("train.jsonl: 4 text example(s)")
    assert "text example(s)" in text.datasets.notes[1]  # the validation spec named it too
    completions = load_text_datasets(data, named, config, model_dir, records="prompt_completion")
    assert "4 prompt/completion example(s)" in completions.datasets.notes[0]
    data.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    with pytest.raises(ValueError, match=r"train\.jsonl, line 1: a record with"):
        load_text_datasets(data, None, config, model_dir, records="text")

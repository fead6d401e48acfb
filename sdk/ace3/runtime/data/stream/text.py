"""Text records streamed from jsonl shards: :class:`TextShardStream`.

Each reader (a DataLoader worker of a rank) reads the records of its own shards as any stream
reader does (:mod:`.reader`: its shards, its shuffle buffer over the raw records, its
position), and tokenizes each record as it comes with the model's tokenizer and chat template,
masked as a ``.jsonl`` file's records are (:func:`ace3.runtime.data.text_records.tokenize_record`),
then truncates it to ``sequence_length`` (:func:`~ace3.runtime.data.text_packing.truncate`:
an example left with nothing to learn is dropped). Unpacked, each example is an item
``{"input_ids", "labels"}``; with ``packing``, whole examples are packed in the order they come
into items of at most ``sequence_length`` tokens (a pack is closed when the next example does
not fit: the same rule and the same per-example separation as a file's,
:func:`~ace3.runtime.data.text_packing.pack_item`), so the packer holds at most one open pack.
Batches are padded by ``collate_text``, as a file's are.

The position (:meth:`TextShardStream.state_dict`) is the reader's, plus ``"text"``: the open
pack's examples (at most ``sequence_length`` tokens) and the counts so far (examples,
truncated, dropped, tokens). A state read between two items resumes at the next one: the
reader's position is past every record the packer has taken, and the open pack holds the
ones not given out yet.

A stream of records has no known length: it cycles for ``max_steps`` (``epochs`` is refused),
as every jsonl stream does. A whole pass over a reader's share whose every record is left out
(nothing to learn within ``sequence_length``) is an error naming its shards, as a file of such
records is: a cycling reader would otherwise read on for ever without an item.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ace3.config import TrainingConfig
from ace3.config.text_records import RecordKind
from ace3.runtime.data.stream.dataset import ShardStream
from ace3.runtime.data.stream.waiting import ENGINE
from ace3.runtime.data.text_packing import pack_item, single_item, truncate
from ace3.runtime.data.text_records import (
    TokenizedExample,
    check_record,
    collate_text,
    tokenize_record,
)
from ace3.runtime.job_spec import DatasetSpec

COUNTS = ("examples", "truncated", "dropped", "tokens", "items")


@dataclass(frozen=True)
class Pass:
    """Where a reader's records come from: ``epoch()``, the pass of the record just read;
    ``shards(epoch)``, that pass's shard files; ``whole``, whether the reader starts at a pass's
    first record (not resumed inside one)."""

    epoch: Callable[[], int]
    shards: Callable[[int], list[str]]
    whole: bool


@dataclass(frozen=True)
class TextSettings:
    """How a stream's records become items: their kind (``named``: the dataset named it, so a
    record need only hold its fields), the tokenizer, ``sequence_length``, packing."""

    kind: RecordKind
    named: bool
    tokenizer: Any
    length: int
    packing: bool
    pad_id: int


class Tokens:
    """One reader's tokenizer and packer (see the module docstring)."""

    def __init__(
        self, settings: TextSettings, state: dict[str, Any] | None, who: str, where: Pass
    ) -> None:
        self.settings = settings
        self.who = who
        self.where = where
        self.epoch: int | None = None  # the pass being read
        self.whole = where.whole  # whether this reader has read that pass from its start
        self.kept = False  # whether that pass has kept an example yet
        state = state or {}
        self.pending = [
            TokenizedExample(input_ids=list(ids), labels=list(labels))
            for ids, labels in state.get("pending", [])
        ]
        self.room = settings.length - sum(len(e.input_ids) for e in self.pending)
        self.counts = {name: int(state.get("counts", {}).get(name, 0)) for name in COUNTS}
        self._told = self.counts["truncated"] > 0

    def state(self) -> dict[str, Any]:
        return {
            "pending": [[e.input_ids, e.labels] for e in self.pending],
            "counts": dict(self.counts),
        }

    def _example(self, file: str, line: int, record: Any) -> TokenizedExample | None:
        settings = self.settings
        try:
            check_record(record, settings.kind, named=settings.named)
            example = tokenize_record(record, settings.kind, settings.tokenizer)
        except ValueError as exc:
            raise ValueError(f"{file}, line {line}: {exc}") from exc
        cut, truncated = truncate(example, settings.length)
        self.counts["truncated"] += truncated
        if cut is None:
            self.counts["dropped"] += 1
            return None
        self.kept = True
        self.counts["examples"] += 1
        self.counts["tokens"] += len(cut.input_ids)
        if truncated and not self._told:
            self._told = True
            ENGINE.info(
                f"{self.who}: {file}, line {line} has more than sequence_length="
                f"{settings.length} tokens: such examples are truncated (the run's summary counts "
                "them: text_truncated)"
            )
        return cut

    def _passed(self) -> None:
        """Before a record: a ValueError when the pass that just ended was read whole and kept
        no example (a cycling reader would read on for ever; a validation reader gives none)."""
        if self.epoch is not None and self.whole and not self.kept:
            shards = ", ".join(self.where.shards(self.epoch))
            raise ValueError(
                f"{self.who}: no record of its shards ({shards}) learns anything within "
                f"sequence_length={self.settings.length} (each one, truncated, keeps no learned "
                "token after its first); raise sequence_length or shorten the prompts"
            )

    def _given(self, item: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.counts["items"] += 1
        return item

    def items(self, records: Iterator[Any]) -> Iterator[dict[str, torch.Tensor]]:
        """The items of ``records`` (``(file, line, record)``): the pending pack is updated
        before an item is given out."""
        length = self.settings.length
        for file, line, record in records:
            epoch = self.where.epoch()
            if epoch != self.epoch:
                self._passed()
                self.whole = self.epoch is not None or self.whole
                self.epoch, self.kept = epoch, False
            example = self._example(file, line, record)
            if example is None:
                continue
            if not self.settings.packing:
                yield self._given(single_item(example))
                continue
            if self.pending and len(example.input_ids) > self.room:
                pack, self.pending = self.pending, [example]
                self.room = length - len(example.input_ids)
                yield self._given(pack_item(pack))
            else:
                self.pending.append(example)
                self.room -= len(example.input_ids)
        self._passed()  # (the end of a pass that does not cycle)
        if self.pending:
            pack, self.pending, self.room = self.pending, [], length
            yield self._given(pack_item(pack))


class TextShardStream(ShardStream):
    """A :class:`ShardStream` of text records, read as items of token ids (module docstring)."""

    reads_records = True

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
        text: TextSettings,
    ) -> None:
        super().__init__(
            spec, split=split, files=files, config=config, rank=rank, world_size=world_size,
            cycle=cycle,
        )  # fmt: skip
        self.text = text
        self.collate_fn = functools.partial(collate_text, pad_token_id=text.pad_id)
        self._tokens: Tokens | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_tokens"] = None
        return state

    def __iter__(self) -> Any:
        saved = (self._pending or {}).get("text")
        records = super().__iter__()
        live = self._live
        assert live is not None
        position = live.position
        who = f"{self.split} reader {position.reader} of {position.readers}"
        reader = position.reader
        where = Pass(
            epoch=lambda: live.position.epoch,
            shards=lambda epoch: [self.files[s] for s in self.plan.share(epoch, reader)],
            whole=position.fed == 0 and position.cursor == 0 and position.offset == 0,
        )
        self._tokens = Tokens(self.text, saved, who, where)
        return self._tokens.items(records)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self._live is not None and self._tokens is not None:
            state["text"] = self._tokens.state()
        return state


def stream_text_counts(position: Any) -> dict[str, int]:
    """The text counts of every reader in a training position (a loader's state: each reader's
    ``"text"``, wherever the loader keeps it), summed, with ``item_tokens``: the tokens of the
    items given out (the open packs' not yet)."""
    totals = dict.fromkeys((*COUNTS, "item_tokens"), 0)
    found: list[dict[str, Any]] = []

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            text = value.get("text")
            if isinstance(text, dict) and isinstance(text.get("counts"), dict):
                found.append(text)
                return
            for inner in value.values():
                visit(inner)
        elif isinstance(value, list | tuple):
            for inner in value:
                visit(inner)

    visit(position)
    for text in found:
        counts = {name: int(text["counts"].get(name, 0)) for name in COUNTS}
        for name in COUNTS:
            totals[name] += counts[name]
        pending = sum(len(ids) for ids, _labels in text.get("pending", []))
        totals["item_tokens"] += counts["tokens"] - pending
    return totals

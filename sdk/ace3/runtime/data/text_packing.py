"""Tokenized text examples as a map-style dataset: truncation, packing and the batch collator.

Packing puts whole examples one after another into sequences of at most ``sequence_length``
tokens, in order (a pack is closed when the next example does not fit; no example is split
across packs, so each keeps its whole context). Inside a pack, ``position_ids`` restart at 0
for each example, and the label of each example's first token is ``IGNORE_INDEX``: a causal
LM shifts labels, so that token would otherwise be predicted from the previous example's
last token.

What keeps packed examples apart is the model. ``transformers`` (5.x) builds a block-diagonal
causal mask from restarting ``position_ids`` for every attention implementation (eager, sdpa,
flash attention) when it is given no ``attention_mask`` and no cache: so a packed batch from
``collate_text`` carries no ``attention_mask``, and the model must be called with
``use_cache=False`` (with a cache, or a 2-D mask, it skips that detection). Then each packed
example's loss is its unpacked loss. A model that does not derive its mask from
``position_ids`` (custom modelling code, or ``transformers`` before 4.5x) lets each token attend
to the earlier examples of its pack: only the positions restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from ace3.runtime.data.text_masking import IGNORE_INDEX, TokenizedExample, learns_something


@dataclass
class TextReport:
    """What tokenizing, truncating and packing did, for the job's metrics.

    ``padding_share`` is the share of padding among ``items * sequence_length`` positions
    (what fixed-shape batches of full sequences would hold); ``collate_text`` pads only to the
    longest item of each batch, so the padding it adds is at most this share.
    """

    examples: int = 0
    truncated: int = 0
    tokens: int = 0
    padding_share: float = 0.0
    # Examples dropped because they learn nothing (truncation cut off every learned token).
    dropped: int = 0


def truncate(example: TokenizedExample, length: int) -> tuple[TokenizedExample | None, bool]:
    """``example`` cut to ``length`` tokens, and whether it was cut; None for the example when,
    cut, it learns nothing (every learned token was past ``length``)."""
    truncated = len(example.input_ids) > length
    if truncated:
        example = TokenizedExample(
            input_ids=example.input_ids[:length], labels=example.labels[:length]
        )
    return (example if learns_something(example.labels) else None), truncated


def single_item(example: TokenizedExample) -> dict[str, torch.Tensor]:
    """One unpacked example as an item ``{"input_ids", "labels"}``."""
    return {
        "input_ids": torch.tensor(example.input_ids, dtype=torch.long),
        "labels": torch.tensor(example.labels, dtype=torch.long),
    }


def pack_item(pack: Sequence[TokenizedExample]) -> dict[str, torch.Tensor]:
    """Examples packed into one item ``{"input_ids", "labels", "position_ids"}`` (see the
    module docstring: positions restart, each example's first label is ignored)."""
    input_ids: list[int] = []
    labels: list[int] = []
    position_ids: list[int] = []
    for example in pack:
        input_ids += example.input_ids
        # The first token is never learned: it would be predicted from the previous example.
        labels += [IGNORE_INDEX, *example.labels[1:]]
        position_ids += range(len(example.input_ids))
    return {
        "input_ids": torch.tensor(input_ids, dtype=torch.long),
        "labels": torch.tensor(labels, dtype=torch.long),
        "position_ids": torch.tensor(position_ids, dtype=torch.long),
    }


class TokenizedTextDataset(Dataset[dict[str, torch.Tensor]]):
    """Items ``{"input_ids", "labels"}`` (and ``"position_ids"`` when packing), 1-D int64."""

    def __init__(
        self,
        examples: Sequence[TokenizedExample],
        sequence_length: int,
        packing: bool,
        pad_token_id: int,
    ) -> None:
        if sequence_length < 2:
            raise ValueError(f"sequence_length must be at least 2, got {sequence_length}")
        self.sequence_length = sequence_length
        self.packing = packing
        self.pad_token_id = pad_token_id
        self.report = TextReport()
        kept = self._truncated(examples)
        if not kept:
            raise ValueError(
                f"no example learns anything within sequence_length={sequence_length} "
                f"(none of the {len(examples)} keeps a learned token after its first once "
                "truncated); raise sequence_length or shorten the prompts"
            )
        self.items = self._packed(kept) if packing else [single_item(example) for example in kept]
        self.report.examples = len(kept)
        self.report.tokens = sum(len(example.input_ids) for example in kept)
        positions = len(self.items) * sequence_length
        self.report.padding_share = 1.0 - self.report.tokens / positions

    def _truncated(self, examples: Sequence[TokenizedExample]) -> list[TokenizedExample]:
        kept: list[TokenizedExample] = []
        for example in examples:
            cut, truncated = truncate(example, self.sequence_length)
            self.report.truncated += truncated
            if cut is None:
                self.report.dropped += 1
                continue
            kept.append(cut)
        return kept

    def _packed(self, examples: list[TokenizedExample]) -> list[dict[str, torch.Tensor]]:
        packs: list[list[TokenizedExample]] = [[]]
        room = self.sequence_length
        for example in examples:
            if len(example.input_ids) > room:
                packs.append([])
                room = self.sequence_length
            packs[-1].append(example)
            room -= len(example.input_ids)
        return [pack_item(pack) for pack in packs]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.items[index]


def collate_text(
    samples: list[dict[str, torch.Tensor]], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """Right-pad a batch to its longest item, with an ``attention_mask`` of 1 (token) / 0 (pad).

    ``input_ids`` are padded with ``pad_token_id``, ``labels`` with ``IGNORE_INDEX``,
    ``position_ids`` (when present, i.e. packs) with 0. A packed batch gets no
    ``attention_mask``: a 2-D mask would stop ``transformers`` from keeping the examples of
    a pack apart (module docstring); its padding needs none, as padding only follows the
    tokens and is never learned. ``padding_tokens`` counts the padding either way.
    """
    if not samples:
        raise ValueError("cannot collate an empty batch")
    longest = max(len(sample["input_ids"]) for sample in samples)
    fills = {"input_ids": pad_token_id, "labels": IGNORE_INDEX, "position_ids": 0}
    batch: dict[str, torch.Tensor] = {}
    for key, fill in fills.items():
        if key not in samples[0]:
            continue
        batch[key] = torch.full((len(samples), longest), fill, dtype=torch.long)
        for row, sample in enumerate(samples):
            batch[key][row, : len(sample[key])] = sample[key]
    if "position_ids" not in batch:
        attention_mask = torch.zeros((len(samples), longest), dtype=torch.long)
        for row, sample in enumerate(samples):
            attention_mask[row, : len(sample["input_ids"])] = 1
        batch["attention_mask"] = attention_mask
    return batch


def padding_tokens(batch: dict[str, torch.Tensor]) -> int:
    """How many positions of a collated batch are padding (count it in the main process).

    A packed batch has no ``attention_mask``; its padding is each row's trailing run of
    position 0 (every packed example has at least 2 tokens, so a real example never ends
    a row at position 0).
    """
    if "attention_mask" in batch:
        attention_mask = batch["attention_mask"]
        return int(attention_mask.numel() - int(attention_mask.sum()))
    position_ids = batch["position_ids"]
    nonzero = position_ids != 0
    columns = torch.arange(1, position_ids.shape[1] + 1)
    # One past the last nonzero position per row (0 when a row holds no token at all).
    row_ends = (nonzero * columns).amax(dim=1)
    return int((position_ids.shape[1] - row_ends).sum())

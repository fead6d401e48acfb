"""What tokenizing text records did, in the run's summary (``final_metrics``): the examples,
the truncated ones, the ones left out (nothing to learn once truncated), their tokens and the
share of padding (:class:`ace3.runtime.data.text_records.TextReport`'s figures, each named
``text_<field>``).

A ``.jsonl`` file's figures are its training set's (the same on every rank: one pass over the
file). A stream's are counted by each reader as it reads (the data position keeps them, so a
resumed job goes on counting): the records read, over every pass, summed over the data
replicas (an all-reduce at the end, on every rank; the ranks of one replica read the same
records and count them once).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ace3.runtime.data.stream.text import TextShardStream, stream_text_counts
from ace3.runtime.data.text_records import TextReport
from ace3.runtime.loop.extensions import LoopExtension
from ace3.runtime.loop.view import LoopView

FIELDS = ("examples", "truncated", "dropped", "tokens")


def report_metrics(report: TextReport) -> dict[str, Any]:
    """A report's figures, as the summary names them."""
    metrics: dict[str, Any] = {f"text_{name}": int(getattr(report, name)) for name in FIELDS}
    metrics["text_padding_share"] = float(report.padding_share)
    return metrics


class TextCounts(LoopExtension):
    """The summary's text figures of ``train_set`` (a tokenized file's dataset, or a stream of
    records); ``replicas``: how many data replicas the ranks make."""

    def __init__(self, train_set: Any, replicas: int) -> None:
        self.train_set = train_set
        self.replicas = replicas

    def finish(self, loop: LoopView) -> dict[str, Any]:
        report = getattr(self.train_set, "report", None)
        if isinstance(report, TextReport):
            return report_metrics(report)
        if not isinstance(self.train_set, TextShardStream):
            return {}
        counts = stream_text_counts(loop.train_data.position())
        names = (*FIELDS, "items", "item_tokens")
        ctx = loop.ctx
        totals = [float(counts[name]) for name in names]
        if ctx.world_size > 1:  # (every rank: a collective)
            summed = torch.tensor(totals, dtype=torch.float64, device=ctx.device)
            dist.all_reduce(summed)
            ranks_per_replica = max(1, ctx.world_size // max(1, self.replicas))
            totals = (summed / ranks_per_replica).tolist()
        values = dict(zip(names, totals, strict=True))
        positions = values["items"] * self.train_set.text.length
        share = 1.0 - values["item_tokens"] / positions if positions else 0.0
        return report_metrics(
            TextReport(
                examples=round(values["examples"]),
                truncated=round(values["truncated"]),
                tokens=round(values["tokens"]),
                dropped=round(values["dropped"]),
                padding_share=share,
            )
        )

"""A job's result file (``ftmetrics-<job id>``): its metrics as OpenAI's CSV, one line a
reported step, with a fixed set of columns (:data:`RESULT_COLUMNS`), so the file grows with the
steps and not with the metric names a job invents.

The CSV is streamed: its rows are read from ``job_metrics`` in pages of :data:`PAGE_ROWS` along
the ``(job_id, step, name)`` index, each page in a session of its own (no connection is held
between pages). The numbers are the database's own text of each value, so the file's size
(``files.retrieve``'s ``bytes``) is two aggregate queries, without building the file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import String, and_, cast, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3_control.models import JobMetric

#: The CSV's columns after ``step`` (OpenAI's five first) -> the ACE3 metric each shows.
RESULT_COLUMNS: dict[str, str] = {
    "train_loss": "train_loss",
    "train_accuracy": "train_accuracy",
    "valid_loss": "val_loss",
    "valid_mean_token_accuracy": "val_accuracy",
    "val_perplexity": "val_perplexity",
    "learning_rate": "learning_rate",
    "tokens_per_sec": "tokens_per_sec",
}
_COLUMN_OF = {name: column for column, name in RESULT_COLUMNS.items()}
_INDEX = {column: index for index, column in enumerate(RESULT_COLUMNS)}
PAGE_ROWS = 2_000
LINE_END = "\r\n"
#: A spreadsheet reads a cell starting with one of these as a formula.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(text: str) -> str:
    """``text`` as a CSV cell no spreadsheet runs as a formula: a leading ``'`` where it
    starts like one (a number, ``-1.5``, is kept as it is), quoted where it must be."""
    if text.startswith(_FORMULA_STARTS):
        try:
            float(text)
        except ValueError:
            text = "'" + text
    if any(mark in text for mark in ',"\r\n'):
        text = '"' + text.replace('"', '""') + '"'
    return text


def csv_line(cells: list[str]) -> str:
    return ",".join(csv_cell(cell) for cell in cells) + LINE_END


HEADER = csv_line(["step", *RESULT_COLUMNS])


def _known(job_id: str) -> Any:
    return and_(JobMetric.job_id == job_id, JobMetric.name.in_(list(_COLUMN_OF)))


async def _page(
    session: AsyncSession, job_id: str, after: tuple[int, str] | None
) -> list[tuple[int, str, str]]:
    """Up to :data:`PAGE_ROWS` (step, name, value text) after ``after``, by (step, name)."""
    stmt = select(JobMetric.step, JobMetric.name, cast(JobMetric.value, String)).where(
        _known(job_id)
    )
    if after is not None:
        step, name = after
        stmt = stmt.where(
            or_(JobMetric.step > step, and_(JobMetric.step == step, JobMetric.name > name))
        )
    stmt = stmt.order_by(JobMetric.step, JobMetric.name).limit(PAGE_ROWS)
    return [(step, name, text) for step, name, text in (await session.execute(stmt)).all()]


def _line(step: int, values: list[str]) -> str:
    return csv_line([str(step), *values])


async def result_csv(
    session_factory: async_sessionmaker[AsyncSession], job_id: str
) -> AsyncIterator[bytes]:
    """The job's result file, a page of lines at a time (see the module docstring)."""
    yield HEADER.encode()
    after: tuple[int, str] | None = None
    step: int | None = None
    values = [""] * len(RESULT_COLUMNS)
    while True:
        async with session_factory() as session:
            rows = await _page(session, job_id, after)
        lines = []
        for row_step, name, text in rows:
            if step is not None and row_step != step:
                lines.append(_line(step, values))
                values = [""] * len(RESULT_COLUMNS)
            step = row_step
            values[_INDEX[_COLUMN_OF[name]]] = text
        if lines:
            yield "".join(lines).encode()
        if len(rows) < PAGE_ROWS:
            break
        after = rows[-1][:2]
    if step is not None:
        yield _line(step, values).encode()


async def result_csv_size(session: AsyncSession, job_id: str) -> int:
    """The size in bytes of :func:`result_csv`'s file, from two aggregates (a number's text
    never needs quoting or a leading ``'``)."""
    text_bytes = await session.scalar(
        select(func.coalesce(func.sum(func.length(cast(JobMetric.value, String))), 0)).where(
            _known(job_id)
        )
    )
    steps = select(JobMetric.step).where(_known(job_id)).distinct().subquery()
    count, step_bytes = (
        await session.execute(
            select(
                func.count(), func.coalesce(func.sum(func.length(cast(steps.c.step, String))), 0)
            )
        )
    ).one()
    per_line = len(RESULT_COLUMNS) + len(LINE_END)  # the commas and the line's end
    return len(HEADER) + int(text_bytes or 0) + int(step_bytes) + int(count) * per_line

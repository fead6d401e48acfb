"""Cursor pagination: a page of results that can fetch the pages after it.

List endpoints answer ``{"data": [...], "next_cursor": "..." | null}``. Iterating a
:class:`CursorPage` yields every item of this page and of all the pages after it, fetching
them as it goes; ``.data`` is this page only::

    for job in client.jobs.list(state="running"):      # all running jobs, page after page
        print(job.id)
    first = client.jobs.list(limit=10).data            # just the first ten
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

ItemT = TypeVar("ItemT")


class CursorPage(Generic[ItemT]):
    """One page: ``data`` (its items) and ``next_cursor`` (None on the last page)."""

    def __init__(
        self,
        data: list[ItemT],
        next_cursor: str | None,
        fetch: Callable[[str | None], CursorPage[ItemT]] | None = None,
    ):
        self.data = data
        self.next_cursor = next_cursor
        self._fetch = fetch

    def has_next_page(self) -> bool:
        return bool(self.next_cursor) and self._fetch is not None

    def next_page(self) -> CursorPage[ItemT]:
        """Fetch the page after this one (``ValueError`` on the last page: check
        :meth:`has_next_page` first)."""
        if not self.has_next_page():
            raise ValueError("this is the last page: there is no next_cursor to follow")
        assert self._fetch is not None
        return self._fetch(self.next_cursor)

    def iter_pages(self) -> Iterator[CursorPage[ItemT]]:
        """This page, then every page after it."""
        page: CursorPage[ItemT] = self
        seen: set[str] = set()
        while True:
            yield page
            if not page.has_next_page():
                return
            cursor = page.next_cursor
            assert cursor is not None
            if cursor in seen:  # a server bug must not become an endless loop
                raise RuntimeError(f"the server returned the cursor {cursor!r} twice")
            seen.add(cursor)
            page = page.next_page()

    def __iter__(self) -> Iterator[ItemT]:
        for page in self.iter_pages():
            yield from page.data

    def __len__(self) -> int:
        """Items on this page (not the total across pages)."""
        return len(self.data)

    def __repr__(self) -> str:
        return f"CursorPage(items={len(self.data)}, next_cursor={self.next_cursor!r})"

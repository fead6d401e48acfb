"""Cursor pagination walks next_cursor across pages."""

from __future__ import annotations

import httpx
import pytest

from tests.unit.sdk.sdk_fakes import MockAPI, job_json

PAGES = {
    None: ([job_json(id="job_1"), job_json(id="job_2")], "c1"),
    "c1": ([job_json(id="job_3"), job_json(id="job_4")], "c2"),
    "c2": ([job_json(id="job_5")], None),
}


def serve_pages(request: httpx.Request) -> httpx.Response:
    cursor = request.url.params.get("cursor")
    data, next_cursor = PAGES[cursor]
    return httpx.Response(200, json={"data": data, "next_cursor": next_cursor})


def test_iterating_a_page_walks_all_three_pages(api: MockAPI):
    api.route("GET", "/v1/jobs", serve_pages)
    jobs = list(api.client().jobs.list(state="running", limit=2))
    assert [job.id for job in jobs] == ["job_1", "job_2", "job_3", "job_4", "job_5"]
    cursors = [request.url.params.get("cursor") for request in api.requests]
    assert cursors == [None, "c1", "c2"]
    assert all(request.url.params["state"] == "running" for request in api.requests)
    assert all(request.url.params["limit"] == "2" for request in api.requests)


def test_data_is_one_page_and_pages_are_fetched_lazily(api: MockAPI):
    api.route("GET", "/v1/jobs", serve_pages)
    page = api.client().jobs.list()
    assert [job.id for job in page.data] == ["job_1", "job_2"]
    assert page.has_next_page() and len(api.requests) == 1
    pages = list(page.iter_pages())
    assert [p.next_cursor for p in pages] == ["c1", "c2", None]
    assert not pages[-1].has_next_page()
    with pytest.raises(ValueError, match="last page"):
        pages[-1].next_page()


def test_a_repeated_cursor_stops_instead_of_looping(api: MockAPI):
    api.route("GET", "/v1/jobs", httpx.Response(200, json={"data": [], "next_cursor": "same"}))
    with pytest.raises(RuntimeError, match="twice"):
        list(api.client().jobs.list())

"""The base of every resource collection (``client.models``, ``client.jobs``, ...): one REST
call per method over the shared HTTP client, and cursor pages for list calls. Jobs and searches
share retrieve / list by state / cancel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from ace3.client.pagination import CursorPage

if TYPE_CHECKING:
    from ace3.client._http import HTTPClient


ModelT = TypeVar("ModelT", bound=BaseModel)
RunT = TypeVar("RunT", bound=BaseModel)


class _Resource:
    def __init__(self, http: HTTPClient):
        self._http = http

    def _list(
        self, path: str, item_type: type[ModelT], params: Mapping[str, Any], cursor: str | None
    ) -> CursorPage[ModelT]:
        """``GET path`` as a cursor page that fetches the following pages with the same query."""

        def fetch(next_cursor: str | None) -> CursorPage[ModelT]:
            payload = self._http.request(
                "GET", path, params={**params, "cursor": next_cursor}
            ).json()
            items = [item_type.model_validate(item) for item in payload.get("data") or []]
            return CursorPage(items, payload.get("next_cursor"), fetch)

        return fetch(cursor)


class _Runs(_Resource, Generic[RunT]):
    """What jobs and searches share: read one, list them by state, ask one to stop."""

    _path: ClassVar[str]
    _run_type: ClassVar[type[Any]]

    def retrieve(self, run_id: str) -> RunT:
        response = self._http.request("GET", f"{self._path}/{run_id}")
        return self._run(response.json())

    def list(
        self,
        *,
        state: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> CursorPage[RunT]:
        params = {"state": str(state) if state is not None else None, "limit": limit}
        return self._list(self._path, self._run_type, params, cursor)

    def cancel(self, run_id: str) -> RunT:
        """Ask it to stop (idempotent: one that already ended is returned as it is)."""
        response = self._http.request("POST", f"{self._path}/{run_id}/cancel", idempotent=True)
        return self._run(response.json())

    def _create(
        self,
        *,
        model_id: str,
        dataset_id: str,
        config: dict[str, Any],
        validation_dataset_id: str | None,
        model_kwargs: Mapping[str, Any] | None,
        name: str | None,
        idempotency_key: str | None,
        **extra: Any,
    ) -> RunT:
        """``POST`` a new run: the body fields that are set, plus ``extra`` ones not None."""
        body: dict[str, Any] = {"model_id": model_id, "dataset_id": dataset_id, "config": config}
        optional = {
            "validation_dataset_id": validation_dataset_id,
            "model_kwargs": dict(model_kwargs) if model_kwargs else None,
            "name": name,
            **extra,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        response = self._http.request(
            "POST", self._path, json_body=body, idempotency_key=idempotency_key
        )
        return self._run(response.json())

    def _run(self, payload: Any) -> RunT:
        run: RunT = self._run_type.model_validate(payload)
        return run

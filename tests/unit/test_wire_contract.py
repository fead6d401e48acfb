"""The API's response models and the client's types, compared through ``app.openapi()`` of the
real FastAPI app: every field the server sends is a field of the client type that parses it
(and no client field is one no server schema sends), a field the client requires is always sent,
and each field's JSON types and enum values on the server are ones the client accepts. A field
added on one side only, a type changed on one side, or an enum that grows on one side fails
here."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from ace3.client.searches import Search, SearchTrial
from ace3.client.shard_upload import DirectUpload, ShardCheck, StoredShard
from ace3.client.types import (
    Artifact,
    Checkpoint,
    Dataset,
    Environment,
    Job,
    JobEnvironment,
    JobRecord,
    LogLine,
    LogPage,
    Metric,
    Model,
    Package,
    RecordPage,
    Worker,
)
from ace3.client.webhooks import Webhook, WebhookDelivery, WebhookDeliveryAttempt
from ace3_control.settings import Settings
from ace3_server.app import create_app

# Each response schema the client parses, and the client type it parses it with.
PARSED_BY: dict[str, type[BaseModel]] = {
    "ModelOut": Model,
    "DatasetOut": Dataset,
    "StoredShardOut": StoredShard,  # (uploads of a shard directory's shards)
    "ShardCheckOut": ShardCheck,
    "DirectUploadOut": DirectUpload,
    "JobOut": Job,
    "JobListItem": Job,
    "MetricOut": Metric,
    "LogOut": LogLine,
    "RecordOut": JobRecord,
    "CheckpointOut": Checkpoint,
    "UploadedCheckpointOut": Checkpoint,  # (client.checkpoints.upload)
    "ArtifactOut": Artifact,
    "WorkerOut": Worker,
    "EnvironmentOut": Environment,  # (client.environments.get)
    "JobEnvironmentOut": JobEnvironment,  # (a job's environment)
    "PackageOut": Package,
    "SearchOut": Search,
    "SearchTrialOut": SearchTrial,
    "WebhookOut": Webhook,
    "WebhookCreated": Webhook,
    "WebhookDeliveryOut": WebhookDelivery,
    "DeliveryAttemptOut": WebhookDeliveryAttempt,
}
# List bodies the client reads into its page dataclasses (``data`` + the cursor field).
PAGES: dict[str, type[Any]] = {"LogList": LogPage, "RecordList": RecordPage}
# Response schemas the client does not parse into a type of its own: lists it only takes
# ``data`` from (each item is checked above), nested parts, and the CLI-only queue view.
NOT_PARSED = {
    "ArtifactList", "CheckpointList", "MetricList", "SearchTrialList", "WorkerList",
    "JobProgress", "RunPlan", "ErrorOut", "QueueOut", "QueuedJobOut",
}  # fmt: skip


@pytest.fixture(scope="module")
def schemas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    settings = Settings(
        data_dir=Path(tmp_path_factory.mktemp("openapi")),
        database_url="postgresql+psycopg://unused@127.0.0.1:1/unused",  # never connected
        broker_url="redis://127.0.0.1:1/0",
    )
    app = create_app(settings, run_background_loops=False)
    return dict(app.openapi()["components"]["schemas"])


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def kinds(schema: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    """The JSON values a schema admits, as comparable names: ``string``, ``date-time``,
    ``integer``, ``number``, ``boolean``, ``null``, ``object``, ``array``, ``any``, and
    ``enum:<values>`` for an enum (or Literal)."""
    schema = _resolve(schema, defs)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return set().union(*(kinds(part, defs) for part in schema[key]))
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return {"enum:" + ",".join(sorted(map(str, values)))}
    declared = schema.get("type")
    if declared is None:
        return {"any"}
    found = set(declared if isinstance(declared, list) else [declared])
    if "string" in found and schema.get("format") == "date-time":
        found = (found - {"string"}) | {"date-time"}
    return found


def _accepts(client: set[str], sent: str) -> bool:
    return sent in client or "any" in client or (sent == "integer" and "number" in client)


def _client_schema(model: type[BaseModel]) -> tuple[dict[str, Any], dict[str, Any]]:
    schema = model.model_json_schema(mode="validation")
    return schema, schema.get("$defs", {})


def test_every_response_schema_is_compared_or_named_as_not_parsed(
    schemas: dict[str, Any],
) -> None:
    responses = {
        name
        for name in schemas
        if name.endswith(("Out", "List", "Created", "Item")) or name.startswith("Page_")
    }
    pages = {name for name in responses if name.startswith("Page_")}
    unmapped = responses - set(PARSED_BY) - set(PAGES) - NOT_PARSED - pages
    assert not unmapped, f"response schemas with no client type in PARSED_BY: {unmapped}"
    for page in pages:  # Page_<Item>_: the client's CursorPage over the item's client type
        item = page.removeprefix("Page_").removesuffix("_")
        assert item in PARSED_BY, f"{page}: its items ({item}) have no client type"
        assert set(schemas[page]["properties"]) == {"data", "next_cursor"}


@pytest.mark.parametrize("name", sorted(PARSED_BY))
def test_the_client_type_parses_every_field_the_server_sends(
    schemas: dict[str, Any], name: str
) -> None:
    server = schemas[name]
    client, client_defs = _client_schema(PARSED_BY[name])
    sent, declared = server["properties"], client["properties"]
    missing = sorted(set(sent) - set(declared))
    assert not missing, f"{name} sends {missing}, which {PARSED_BY[name].__name__} lacks"
    always_sent = set(server.get("required", []))
    required = set(client.get("required", []))
    assert required <= always_sent, (
        f"{PARSED_BY[name].__name__} requires {sorted(required - always_sent)}, which {name} "
        "may leave out"
    )
    for field, schema in sent.items():
        server_kinds = kinds(schema, schemas)
        client_kinds = kinds(declared[field], client_defs)
        refused = sorted(kind for kind in server_kinds if not _accepts(client_kinds, kind))
        assert not refused, (
            f"{name}.{field}: the server sends {refused}, "
            f"{PARSED_BY[name].__name__}.{field} accepts {sorted(client_kinds)}"
        )
        client_enums = {kind for kind in client_kinds if kind.startswith("enum:")}
        server_enums = {kind for kind in server_kinds if kind.startswith("enum:")}
        assert client_enums == server_enums, f"{name}.{field}: enums differ"


@pytest.mark.parametrize("client_type", sorted(set(PARSED_BY.values()), key=str))
def test_no_client_field_is_one_the_server_never_sends(
    schemas: dict[str, Any], client_type: type[BaseModel]
) -> None:
    sent: set[str] = set()
    for name, parser in PARSED_BY.items():
        if parser is client_type:
            sent |= set(schemas[name]["properties"])
    extra = sorted(set(client_type.model_fields) - sent)
    assert not extra, f"{client_type.__name__} declares {extra}, which no response sends"


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_page_bodies_match_the_clients_pages(schemas: dict[str, Any], name: str) -> None:
    fields = {field.name for field in dataclasses.fields(PAGES[name])}
    assert set(schemas[name]["properties"]) == fields
    assert set(schemas[name].get("required", [])) == fields


def test_the_kinds_tell_types_and_enums_apart() -> None:
    """The comparison above can fail: a changed type or enum value is seen."""
    defs = {"State": {"type": "string", "enum": ["a", "b"]}}
    assert kinds({"$ref": "#/components/schemas/State"}, defs) == {"enum:a,b"}
    assert kinds({"anyOf": [{"type": "integer"}, {"type": "null"}]}, {}) == {"integer", "null"}
    assert kinds({"type": "string", "format": "date-time"}, {}) == {"date-time"}
    assert not _accepts({"string"}, "integer") and _accepts({"number"}, "integer")
    assert not _accepts({"enum:a,b"}, "enum:a,b,c")

"""schemathesis over the real stack's OpenAPI document: no generated request, valid or not,
gets a server error, and every response has a status code and content type the document lists.

Bounded for CI (about 15 s once the stack runs): a few derandomized examples per operation,
valid and invalid, so every run sends the same requests. The operations are listed from the app
itself, and must be exactly those the stack serves: a route added later is tested, never skipped.
"""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance

from ace3_control.settings import Settings
from ace3_server.app import create_app
from tests.conftest import Stack

EXAMPLES_PER_OPERATION = 20
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]
OPERATIONS = sorted(
    (method.upper(), path)
    for path, item in create_app(Settings(), run_background_loops=False).openapi()["paths"].items()
    for method in item
)


@pytest.fixture(scope="module")
def api_schema(stack: Stack) -> schemathesis.BaseSchema:
    """The document the stack serves, which must list exactly the operations tested here."""
    schema = schemathesis.openapi.from_url(f"{stack.base_url}/openapi.json")
    served = sorted(
        (operation.method.upper(), operation.path)
        for operation in (result.ok() for result in schema.get_all_operations())
    )
    assert served == OPERATIONS
    return schema


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_no_generated_request_gets_a_server_error(
    api_schema: schemathesis.BaseSchema, api_key: tuple[str, str], method: str, path: str
) -> None:
    operation = api_schema[path][method]
    strategy = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(
        GenerationMode.NEGATIVE
    )
    authorization = {"Authorization": f"Bearer {api_key[0]}"}

    @hypothesis.given(case=strategy)
    @hypothesis.settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    def send(case: schemathesis.Case) -> None:
        case.call_and_validate(headers=authorization, checks=CHECKS, timeout=10)

    send()

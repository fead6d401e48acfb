"""Every code snippet of the ACE3 document has a conformance test, and the suite's copy of
the document is the project's."""

import pytest

from tests.conformance import test_local_snippets, test_service_snippets
from tests.conformance.snippets import document_path, document_snippets, project_copy


def test_every_snippet_of_the_document_is_covered() -> None:
    covered = test_local_snippets.COVERED | test_service_snippets.COVERED
    assert test_local_snippets.COVERED.isdisjoint(test_service_snippets.COVERED)
    assert set(document_snippets()) == covered


def test_the_suite_runs_the_project_s_document() -> None:
    original = project_copy()
    if original is None:
        pytest.skip("the project's seeds folder is not next to this clone")
    assert document_path().read_bytes() == original.read_bytes()

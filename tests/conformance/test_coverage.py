"""Every code snippet of the ACE3 document has a conformance test."""

from tests.conformance import test_local_snippets, test_service_snippets
from tests.conformance.snippets import document_snippets


def test_every_snippet_of_the_document_is_covered() -> None:
    covered = test_local_snippets.COVERED | test_service_snippets.COVERED
    assert test_local_snippets.COVERED.isdisjoint(test_service_snippets.COVERED)
    assert set(document_snippets()) == covered

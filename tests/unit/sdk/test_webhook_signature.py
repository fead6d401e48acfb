"""ace3.webhooks: a body signed the way the server signs it verifies; a changed body, another
secret, a stale timestamp or a malformed header raises WebhookSignatureError."""

from __future__ import annotations

import json

import pytest

from ace3.errors import ACE3Error, WebhookSignatureError
from ace3.webhooks import signature_header, verify_signature

SECRET = "whsec_test"
BODY = json.dumps({"id": "d1", "type": "job.succeeded", "data": {"job": {"id": "j"}}}).encode()
NOW = 1_800_000_000


def test_a_signed_body_verifies_and_is_parsed() -> None:
    header = signature_header(SECRET, BODY, timestamp=NOW)
    assert header.startswith(f"t={NOW},v1=")
    assert verify_signature(SECRET, BODY, header, now=NOW + 10)["type"] == "job.succeeded"
    assert verify_signature(SECRET, BODY.decode(), header, now=NOW)["id"] == "d1"


@pytest.mark.parametrize(
    ("secret", "body", "now", "reason"),
    [
        ("whsec_other", BODY, NOW, "no signature matches"),
        (SECRET, BODY.replace(b"succeeded", b"failed"), NOW, "no signature matches"),
        (SECRET, BODY, NOW + 301, "tolerance 300 s"),
        (SECRET, BODY, NOW - 301, "tolerance 300 s"),
    ],
)
def test_a_wrong_secret_an_altered_body_or_a_stale_timestamp_is_refused(
    secret: str, body: bytes, now: int, reason: str
) -> None:
    header = signature_header(SECRET, BODY, timestamp=NOW)
    with pytest.raises(WebhookSignatureError, match=reason) as caught:
        verify_signature(secret, body, header, now=now)
    assert isinstance(caught.value, ACE3Error)


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "no ACE3-Signature header"),
        ("", "no ACE3-Signature header"),
        ("v1=abc", "no t= timestamp"),
        (f"t={NOW}", "no v1= signature"),
        ("t=soon,v1=abc", "not an integer"),
    ],
)
def test_a_missing_or_malformed_header_is_refused(header: str | None, reason: str) -> None:
    with pytest.raises(WebhookSignatureError, match=reason):
        verify_signature(SECRET, BODY, header, now=NOW)


@pytest.mark.parametrize("signature", ["é" * 64, "\udcff", "ü"])
def test_a_non_ascii_signature_is_refused_not_a_type_error(signature: str) -> None:
    header = f"t={NOW},v1={signature}"
    with pytest.raises(WebhookSignatureError, match="no signature matches"):
        verify_signature(SECRET, BODY, header, now=NOW)


def test_a_webhooks_secret_stays_out_of_its_repr() -> None:
    from ace3.client.webhooks import Webhook

    hook = Webhook(id="w1", url="https://h/", secret="whsec_topsecret")
    assert hook.secret == "whsec_topsecret"
    assert "whsec_topsecret" not in repr(hook) and "whsec_topsecret" not in str(hook)

"""Signing and verifying ACE3 webhook requests (torch-free: import it in any web app).

ACE3 POSTs each event with the header ``ACE3-Signature: t=<unix seconds>,v1=<hex>`` where the
hex is HMAC-SHA256 of ``f"{t}.{raw body}"`` under the webhook's secret (shown once, when the
webhook is created). Verify the raw bytes before parsing them::

    from ace3.webhooks import verify_signature

    event = verify_signature(secret, request_body_bytes, request.headers["ACE3-Signature"])

The timestamp bounds replays: a signature older (or newer) than ``tolerance`` seconds is
refused. Bodies carry a stable ``id``: a retried delivery repeats it, so drop ids you have seen.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

from ace3.errors.refusals import WebhookSignatureError

__all__ = [
    "DELIVERY_ID_HEADER",
    "SIGNATURE_HEADER",
    "WEBHOOK_ID_HEADER",
    "sign",
    "signature_header",
    "verify_signature",
]

SIGNATURE_HEADER = "ACE3-Signature"
WEBHOOK_ID_HEADER = "ACE3-Webhook-Id"
DELIVERY_ID_HEADER = "ACE3-Delivery-Id"
DEFAULT_TOLERANCE_SECONDS = 300


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``f"{timestamp}.{body}"`` under ``secret``."""
    message = str(int(timestamp)).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signature_header(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The ``ACE3-Signature`` value for ``body`` (now, unless ``timestamp`` is given)."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={t},v1={sign(secret, t, body)}"


def _parse(header: str) -> tuple[int, list[str]]:
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if key == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise WebhookSignatureError("the t= timestamp is not an integer") from None
        elif key == "v1":
            signatures.append(value)
    if timestamp is None:
        raise WebhookSignatureError("the header has no t= timestamp")
    if not signatures:
        raise WebhookSignatureError("the header has no v1= signature")
    return timestamp, signatures


def verify_signature(
    secret: str,
    body: bytes | str,
    header: str | None,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """Check ``header`` (the ``ACE3-Signature`` value) against the raw ``body`` and return the
    parsed event. Raises :class:`ace3.errors.WebhookSignatureError` when the header is missing
    or malformed, no signature matches (constant-time comparison), or its timestamp is more
    than ``tolerance`` seconds from ``now`` (a replay)."""
    if not header:
        raise WebhookSignatureError(f"no {SIGNATURE_HEADER} header")
    raw = body.encode() if isinstance(body, str) else bytes(body)
    timestamp, signatures = _parse(header)
    expected = sign(secret, timestamp, raw)
    wanted = expected.encode("ascii")
    # Compare bytes: compare_digest raises TypeError on a non-ASCII str, and a header is
    # whatever the sender put there.
    if not any(
        hmac.compare_digest(wanted, candidate.encode("utf-8", "surrogateescape"))
        for candidate in signatures
    ):
        raise WebhookSignatureError("no signature matches this body and secret")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise WebhookSignatureError(
            f"the timestamp is {abs(current - timestamp):.0f} s away from now "
            f"(tolerance {tolerance:g} s): a replayed or delayed request"
        )
    try:
        event = json.loads(raw)
    except ValueError:
        raise WebhookSignatureError("the body is not JSON") from None
    if not isinstance(event, dict):
        raise WebhookSignatureError("the body is not a JSON object")
    return event

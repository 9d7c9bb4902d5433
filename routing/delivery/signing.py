"""The Standard Webhooks signing scheme (https://www.standardwebhooks.com/).

Headers ``webhook-id``, ``webhook-timestamp`` (unix seconds) and ``webhook-signature``
(``v1,<base64 HMAC-SHA256(secret, "{id}.{timestamp}.{body}")>``). Secrets are ``whsec_`` plus
the base64 of the secret bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"  # noqa: S105  (the format's prefix, not a secret)
SECRET_BYTES = 32


def secret_generate() -> str:
    """A new endpoint secret: ``whsec_`` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_bytes(secret: str) -> bytes:
    """The key bytes of a ``whsec_…`` secret (ValueError if it is not valid base64)."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)


def signature(*, secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for one message."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(*, secret: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers for one attempt."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(
            secret=secret, message_id=message_id, timestamp=timestamp, body=body
        ),
    }

"""CRM credentials encrypted at rest (Fernet: AES-128-CBC + HMAC-SHA256, from ``cryptography``).

Keys come from ``CRM_SECRET_KEYS`` (comma-separated Fernet keys, the first encrypts, all decrypt:
add a new key in front, run ``manage.py crm_rotate_key``, then drop the old one). Without it a
key is derived from ``SECRET_KEY`` with HKDF, so a fresh install works and a database dump alone
does not reveal a token. A value that no key opens raises ``SecretUnreadable`` (never returns
garbage, never includes the value in the message).
"""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

PREFIX = "fernet:"


class SecretUnreadable(ValueError):
    """The stored secret cannot be decrypted with the configured keys."""


def _derived_key() -> bytes:
    hkdf = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=b"leadrouter-crm-secrets", info=b"fernet-v1"
    )
    return base64.urlsafe_b64encode(hkdf.derive(settings.SECRET_KEY.encode()))


def _keys() -> list[bytes]:
    configured = [k.strip() for k in getattr(settings, "CRM_SECRET_KEYS", []) if k.strip()]
    return [k.encode() for k in configured] or [_derived_key()]


def _fernet() -> MultiFernet:
    try:
        return MultiFernet([Fernet(key) for key in _keys()])
    except (ValueError, TypeError) as exc:
        raise SecretUnreadable(
            "CRM_SECRET_KEYS holds a value that is not a Fernet key "
            "(32 url-safe base64 bytes; make one with `manage.py crm_rotate_key --new-key`)"
        ) from exc


def secret_seal(plaintext: str) -> str:
    """Encrypt a credential for storage ("" stays "")."""
    if not plaintext:
        return ""
    return PREFIX + _fernet().encrypt(plaintext.encode()).decode()


def secret_open(stored: str) -> str:
    """Decrypt a stored credential ("" stays ""); SecretUnreadable when no key opens it."""
    if not stored:
        return ""
    if not stored.startswith(PREFIX):
        raise SecretUnreadable("the stored secret is not in the encrypted format")
    try:
        return _fernet().decrypt(stored[len(PREFIX) :].encode()).decode()
    except (InvalidToken, UnicodeDecodeError) as exc:
        raise SecretUnreadable(
            "the stored secret cannot be decrypted with CRM_SECRET_KEYS (or SECRET_KEY changed)"
        ) from exc


def secret_reseal(stored: str) -> str:
    """The same credential encrypted under the current first key (key rotation)."""
    if not stored:
        return ""
    if not stored.startswith(PREFIX):
        raise SecretUnreadable("the stored secret is not in the encrypted format")
    try:
        return PREFIX + _fernet().rotate(stored[len(PREFIX) :].encode()).decode()
    except InvalidToken as exc:
        raise SecretUnreadable(
            "the stored secret cannot be decrypted with CRM_SECRET_KEYS"
        ) from exc


def secret_hint(plaintext: str) -> str:
    """What the admin may show of a credential after saving: its length and last 4 characters."""
    if not plaintext:
        return ""
    tail = plaintext.strip()[-4:] if len(plaintext.strip()) >= 12 else ""
    return f"{len(plaintext)} characters" + (f", ending …{tail}" if tail else "")


def new_key() -> str:
    """A new Fernet key for CRM_SECRET_KEYS."""
    return Fernet.generate_key().decode()

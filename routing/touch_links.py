"""The one-click "I'm on it" link's token: signed, expiring, naming one assignment and its rep.

Only signing here (no models, no services), so the delivery outbox can put a link in a rep's
message and ``routing.rep_access`` can read it back, without either importing the other.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.core import signing
from django.urls import reverse

TOUCH_LINK_SALT = "leadrouter.touch-link"


class TouchLinkError(Exception):
    """A link that cannot record a touch: ``code``, a sentence for the rep, the HTTP status."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def links_base_url() -> str:
    """Where links in messages to reps point (``DELIVERY_LINK_BASE_URL``; empty: bare paths)."""
    return str(settings.DELIVERY_LINK_BASE_URL).rstrip("/")


def touch_link_token(*, assignment_id: int, rep_id: int) -> str:
    """A new signed one-click token for this assignment and rep (a fresh nonce each call)."""
    claims = {"a": assignment_id, "r": rep_id, "n": secrets.token_urlsafe(16)}
    return signing.dumps(claims, salt=TOUCH_LINK_SALT)


def touch_link_url(*, assignment_id: int, rep_id: int) -> str:
    """The one-click link, absolute when ``DELIVERY_LINK_BASE_URL`` is set."""
    token = touch_link_token(assignment_id=assignment_id, rep_id=rep_id)
    return links_base_url() + reverse("touch-link", kwargs={"token": token})


def touch_link_claims(token: str) -> tuple[int, int, str]:
    """(assignment id, rep id, nonce) of a valid, unexpired token; ``TouchLinkError`` else."""
    try:
        claims = signing.loads(
            token, salt=TOUCH_LINK_SALT, max_age=settings.TOUCH_LINK_MAX_AGE_SECONDS
        )
    except signing.SignatureExpired:
        raise TouchLinkError(
            "expired", "This link has expired: open your leads page instead.", 410
        ) from None
    except (signing.BadSignature, ValueError, UnicodeError):
        raise TouchLinkError("invalid", "This link is not valid.", 404) from None
    try:
        assignment_id, rep_id, nonce = int(claims["a"]), int(claims["r"]), str(claims["n"])
    except (KeyError, TypeError, ValueError):
        raise TouchLinkError("invalid", "This link is not valid.", 404) from None
    if not nonce or len(nonce) > 64:
        raise TouchLinkError("invalid", "This link is not valid.", 404)
    return assignment_id, rep_id, nonce

"""System checks of our own (``manage.py check``; ``--deploy`` for the production ones)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, register

from config.staticfiles import COLLECT_COMMAND, manifest_missing


@register(Tags.staticfiles, deploy=True)
def static_manifest_check(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """The manifest storage needs ``collectstatic`` to have run into ``STATIC_ROOT``."""
    path = manifest_missing()
    if path is None:
        return []
    return [
        Error(
            f"Static files were not collected: no manifest at {path}.",
            hint=f"Run `{COLLECT_COMMAND}` before starting the web process.",
            id="leadrouter.E001",
        )
    ]


@register(Tags.security, deploy=True)
def privacy_keys_check(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Production keeps its privacy keys outside the code's directory (docs/operations.md).

    The embedded default generates them under ``var/``: fine on a laptop, but a key file beside
    the code ends up in images, copies and backups of it, which then open every sealed person;
    and a rebuilt image would generate new keys, losing every person's sealed history.
    """
    missing = list(getattr(settings, "PRIVACY_KEYS_GENERATED", []))
    if not missing:
        return []
    return [
        Error(
            f"{' and '.join(missing)} not set: the privacy keys were generated under var/.",
            hint="Set PRIVACY_KEYS (a Fernet key) and PRIVACY_HASH_KEY in the environment, "
            "kept outside the database and the image, and back them up (docs/operations.md, "
            '"Keys"). To keep the keys generated so far, copy var/privacy-key and '
            "var/privacy-hash-key into them.",
            id="leadrouter.E002",
        )
    ]

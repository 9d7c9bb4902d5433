"""System checks of our own (``manage.py check``; ``--deploy`` for the production ones)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, register
from django.core.checks import Warning as CheckWarning

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


@register(Tags.security)
def privacy_key_material_check(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """The privacy keys are well formed, or nothing starts (``migrate``, ``runserver``, the
    worker): a malformed key would otherwise stop routing at the first lead."""
    from leads.privacy import key_material_problems

    return [
        Error(
            f"{problem}.",
            hint="Fix the variable (a Fernet key from `manage.py privacy_rewrap --new-key`; "
            "PRIVACY_HASH_KEY set once, at least 32 random characters) and start again "
            '(docs/operations.md, "Keys").',
            id="leadrouter.E003",
        )
        for problem in key_material_problems()
    ]


@register(Tags.database)
def privacy_keys_open_check(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckWarning]:
    """The configured master keys open the person keys in the database (``migrate`` and
    ``check --database`` run it): a removed or lost master key is said before the first lead
    of one of its people fails. A warning, not an error: new people still route."""
    from django.db import DatabaseError

    from leads.privacy import PrivacyKeyError, key_material_problems, unopenable_key_groups

    if not databases or key_material_problems():
        return []
    try:
        groups = unopenable_key_groups()
    except (DatabaseError, PrivacyKeyError):  # no table yet (before migrate), or said by E003
        return []
    return [
        CheckWarning(
            f"{n} person key(s) wrapped by master key {wrapped_by} cannot be opened with "
            "PRIVACY_KEYS: their people's sealed history reads 'unreadable', and their next "
            "leads fail with a privacy key error until the key is back."
            if wrapped_by != "lost"
            else f"{n} person key(s) are marked lost (no key in PRIVACY_KEYS opens them).",
            hint="Put the removed master key back in PRIVACY_KEYS, after the first, restart, "
            'and run `manage.py privacy_rewrap` (docs/operations.md, "Losing a key").',
            id="leadrouter.W001",
        )
        for wrapped_by, n in groups
    ]


@register(Tags.security, deploy=True)
def console_mail_check(app_configs: Any = None, **kwargs: Any) -> list[CheckWarning]:
    """E-mail printed to the console (``EMAIL_URL``'s default) puts every rep's notification,
    with the lead's name, e-mail, phone and company, into the worker's log: personal data where
    no erasure or retention reaches it (docs/operations.md, "Privacy")."""
    backend = str(getattr(settings, "EMAIL_BACKEND", ""))
    if not settings.DELIVERY_EMAIL_ENABLED or not backend.endswith("console.EmailBackend"):
        return []
    return [
        CheckWarning(
            "E-mail goes to the console: each rep's notification prints the lead's personal "
            "data into the worker's log, which erasure and retention cannot reach.",
            hint="Set EMAIL_URL to your mail server (smtp+tls://...), or "
            "DELIVERY_EMAIL_ENABLED=false if reps are told another way.",
            id="leadrouter.W002",
        )
    ]

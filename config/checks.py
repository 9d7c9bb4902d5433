"""System checks of our own (``manage.py check``; ``--deploy`` for the production ones)."""

from __future__ import annotations

from typing import Any

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

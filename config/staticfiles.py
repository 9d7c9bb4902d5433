"""The static files storage of the production settings, and what "not collected" means."""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles.storage import ManifestFilesMixin
from django.core.files.storage import storages
from whitenoise.storage import CompressedManifestStaticFilesStorage

logger = logging.getLogger(__name__)

COLLECT_COMMAND = "python manage.py collectstatic --noinput"


def manifest_missing() -> Path | None:
    """The manifest's path when the configured storage needs one and it is not there, else None."""
    storage = storages["staticfiles"]
    if not isinstance(storage, ManifestFilesMixin):
        return None
    if storage.manifest_storage.exists(storage.manifest_name):
        return None
    return Path(settings.STATIC_ROOT) / storage.manifest_name


def missing_message(path: Path) -> str:
    """What an operator reads when the manifest is missing: the cause and the command."""
    return (
        f"static files were not collected: run `{COLLECT_COMMAND}` and restart the web process "
        f"(no manifest at {path})"
    )


class StaticStorage(CompressedManifestStaticFilesStorage):
    """WhiteNoise's manifest storage, except that a missing manifest is not a 500 on every page.

    Without the manifest (``collectstatic`` skipped, a volume mounted over ``STATIC_ROOT``) every
    ``{% static %}`` raised, so the login page and the whole admin answered 500. Now each name
    falls back to its unhashed URL (the page renders, without its styles), the error is logged
    once per process naming the command, and ``/readyz`` and ``check --deploy`` fail with it. A
    manifest that exists but lacks an entry still raises: that is a bug, not a deployment step.
    """

    _warned = False
    hashed_files: dict[str, str]  # set by ManifestFilesMixin.__init__ (untyped there)

    def stored_name(self, name: str) -> str:
        if not self.hashed_files:
            if not self.manifest_storage.exists(self.manifest_name):
                if not StaticStorage._warned:
                    StaticStorage._warned = True
                    logger.error(missing_message(Path(settings.STATIC_ROOT) / self.manifest_name))
                return name
            # Collected after this process started: use the manifest now, not after a restart.
            self.hashed_files, self.manifest_hash = self.load_manifest()
        return str(super().stored_name(name))

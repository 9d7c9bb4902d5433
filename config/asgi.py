"""ASGI entry point: ``config.asgi:application`` (uvicorn in ``make run``'s Procfile).

The process that serves the lead status URLs, whose ``?wait=`` requests wait as coroutines
(leads.status_api); it runs the same project with only async-capable middleware
(``ASGI_PROCESS`` in the settings). Leads are accepted by the sync web process (gunicorn).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
os.environ["LEADROUTER_ASGI_PROCESS"] = "1"

application = get_asgi_application()

"""ASGI entry point: ``config.asgi:application`` (uvicorn in ``make run``'s Procfile).

The process that serves the lead status URLs, whose ``?wait=`` requests wait as coroutines
(leads.status_api); it runs the same project with only async-capable middleware
(``ASGI_PROCESS`` in the settings); the status URL itself is answered in front of Django's
handler by leads.status_asgi. Leads are accepted by the sync web process (gunicorn).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
os.environ["LEADROUTER_ASGI_PROCESS"] = "1"

django_application = get_asgi_application()

# The status URL is answered in front of Django's handler (leads.status_asgi): the same answer,
# without the per-request thread hops that make up most of a Django ASGI request's cost.
from leads.status_asgi import status_fast_path  # noqa: E402 (needs the apps loaded)

application = status_fast_path(django_application)

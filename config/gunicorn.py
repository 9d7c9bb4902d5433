"""gunicorn settings; each can be overridden with the usual GUNICORN_* / PORT variables."""

import os

bind = os.environ.get(
    "GUNICORN_BIND", f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"
)
# Sync workers: gthread measured unstable on this class of machine (performance guide).
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_class = "sync"
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "20"))
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "10000"))
max_requests_jitter = 500
accesslog = "-"
# No query string in the access log: a source token may ride in ?token= (api.md) and must
# never reach the logs.
access_log_format = '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(B)s %(L)ss'
# gunicorn's control socket defaults to one per user (~/.gunicorn); two servers run by one user
# (make run beside the test suite) would share it. We do not use it.
control_socket_disable = True

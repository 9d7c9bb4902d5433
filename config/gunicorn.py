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

# gunicorn's own loggers print URLs too ("Error handling request POST /...?token=..." on
# gunicorn.error): both go through the token filter. gunicorn's usual formats and streams
# (errors to stderr, access lines to stdout); not propagated, so nothing prints twice.
# In a worker, Django's LOGGING then reconfigures gunicorn.access (same filter, its format).
_REDACT = {"()": "config.logging.RedactTokensFilter"}
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact_tokens": _REDACT},
    "formatters": {
        "generic": {
            "format": "%(asctime)s [%(process)d] [%(levelname)s] %(message)s",
            "datefmt": "[%Y-%m-%d %H:%M:%S %z]",
            "class": "logging.Formatter",
        },
        "access": {"format": "%(message)s", "class": "logging.Formatter"},
    },
    "handlers": {
        "error_console": {
            "class": "logging.StreamHandler",
            "formatter": "generic",
            "filters": ["redact_tokens"],
            "stream": "ext://sys.stderr",
        },
        "access_console": {
            "class": "logging.StreamHandler",
            "formatter": "access",
            "filters": ["redact_tokens"],
            "stream": "ext://sys.stdout",
        },
    },
    "root": {"level": "INFO", "handlers": ["error_console"]},
    "loggers": {
        # No "level": gunicorn has set them already (--log-level / loglevel for errors).
        "gunicorn.error": {
            "handlers": ["error_console"],
            "filters": ["redact_tokens"],
            "propagate": False,
        },
        "gunicorn.access": {
            "handlers": ["access_console"],
            "filters": ["redact_tokens"],
            "propagate": False,
        },
    },
}

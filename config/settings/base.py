"""LeadRouter settings, read from the environment.

Every deployment uses this module; they differ only by environment values (see the README's
configuration table). With nothing set, LeadRouter runs on a laptop: SQLite in WAL mode and a
filesystem Celery broker under ``var/``, no servers needed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import environ
from celery.schedules import crontab
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()
if (BASE_DIR / ".env").is_file():  # optional: without it, django-environ logs a line per process
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

VAR_DIR = Path(env.str("LEADROUTER_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _var_key(name: str, make: Callable[[], str], folder: Path | None = None) -> str:
    """A key generated once under ``var/``: two processes agree on it, and none reads it half
    written (it is written whole to a file of its own, then linked into place; the first link
    wins and the others read the winner's)."""
    folder = folder or VAR_DIR
    key_file = folder / name
    if not key_file.exists():
        fd, draft = tempfile.mkstemp(prefix=f".{name}-", dir=folder)  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(make())
            with contextlib.suppress(FileExistsError):
                os.link(draft, key_file)
        finally:
            os.unlink(draft)
    return key_file.read_text().strip()


def _secret_key() -> str:
    """The configured key, else one generated once and kept under ``var/`` for laptops."""
    configured: str = env.str("SECRET_KEY", default="")
    if configured:
        return configured
    return _var_key("secret-key", lambda: secrets.token_urlsafe(50))


SECRET_KEY = _secret_key()
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS: list[str] = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS: list[str] = env.list("CSRF_TRUSTED_ORIGINS", default=[])
BEHIND_TLS_PROXY = env.bool("BEHIND_TLS_PROXY", default=False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if BEHIND_TLS_PROXY else None

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "leads",
    "routing",
    "audit",
]

CSRF_FAILURE_VIEW = "config.errors.csrf_failure"

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "config.errors.DatabaseUnavailableMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Pages show times in the user's zone, else the browser's, else TIME_ZONE (audit.timezones).
    "audit.timezones.UserTimeZoneMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
# The ASGI process (config.asgi: the status URLs' waiting requests) runs only middleware that is
# async as well as sync: one sync-only middleware would make Django hold a thread for each waiting
# request. It serves no static files (WhiteNoise is sync-only); the web process does.
ASGI_PROCESS = env.bool("LEADROUTER_ASGI_PROCESS", default=False)
if ASGI_PROCESS:
    MIDDLEWARE.remove("whitenoise.middleware.WhiteNoiseMiddleware")
    MIDDLEWARE.remove("audit.timezones.UserTimeZoneMiddleware")  # sync-only; no pages there
else:
    # The intake URLs skip the middleware only pages need (config.pages_only, issue 18).
    PAGES_ONLY = {
        "whitenoise.middleware.WhiteNoiseMiddleware": "config.pages_only.WhiteNoise",
        "django.contrib.sessions.middleware.SessionMiddleware": "config.pages_only.Session",
        "django.contrib.auth.middleware.AuthenticationMiddleware": (
            "config.pages_only.Authentication"
        ),
        "audit.timezones.UserTimeZoneMiddleware": "config.pages_only.UserTimeZone",
        "django.contrib.messages.middleware.MessageMiddleware": "config.pages_only.Messages",
    }
    MIDDLEWARE = [PAGES_ONLY.get(path, path) for path in MIDDLEWARE]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
# PostgreSQL via DATABASE_URL, with persistent connections (reconnecting on every request costs
# ~5x on intake, see the performance guide). Without it, SQLite in WAL mode: concurrent readers,
# a busy timeout instead of "database is locked", and IMMEDIATE transactions so a writer takes
# its lock up front rather than failing on upgrade.
DATABASES: dict[str, dict[str, Any]] = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'leadrouter.sqlite3'}")
}
_db = DATABASES["default"]
IS_SQLITE = _db["ENGINE"].endswith("sqlite3")
if IS_SQLITE:
    _db.setdefault("OPTIONS", {}).update(
        {
            "timeout": env.int("SQLITE_BUSY_TIMEOUT_SECONDS", default=20),
            "transaction_mode": "IMMEDIATE",
            "init_command": (
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
                f"PRAGMA busy_timeout={env.int('SQLITE_BUSY_TIMEOUT_SECONDS', default=20) * 1000};"
            ),
        }
    )
    _db["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=0)
else:
    _db["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=600)
    _db["CONN_HEALTH_CHECKS"] = True
    _db.setdefault("OPTIONS", {}).setdefault(
        "connect_timeout", env.int("DB_CONNECT_TIMEOUT", default=5)
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# SQLite cannot defer a unique constraint (team membership positions): it is enforced on
# PostgreSQL, and the warning would otherwise print on every migrate.
SILENCED_SYSTEM_CHECKS = ["models.W038"] if IS_SQLITE else []

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# --- Pages (audit app: history, dashboard, login) ----------------------------------------------
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"  # managers: the history; reps: their own leads
LOGOUT_REDIRECT_URL = "login"
# When on, a user who is neither a superuser nor allowed to change teams (RevOps) sees only the
# leads currently owned within the teams they manage (Team.manager).
HISTORY_SCOPE_TO_MANAGED_TEAMS = env.bool("HISTORY_SCOPE_TO_MANAGED_TEAMS", default=False)
# The zone pages show times in for a user who chose none and whose browser said none (an IANA
# name). Stored times and the API stay UTC whatever it says.
PAGES_TIME_ZONE = env.str("PAGES_TIME_ZONE", default="UTC")
# Single sign-on with OpenID Connect (audit.sso, mozilla-django-oidc): off unless a client id is
# set. The provider is its issuer (endpoints from its /.well-known/openid-configuration, fetched
# when first needed and cached) or the four endpoints set one by one; id tokens must be RS256,
# signed by a key of the provider's JWKS, for this client (aud) and, with an issuer, from it.
OIDC_RP_CLIENT_ID: str = env.str("OIDC_RP_CLIENT_ID", default="")
OIDC_RP_CLIENT_SECRET: str = env.str("OIDC_RP_CLIENT_SECRET", default="")
OIDC_OP_ISSUER: str = env.str("OIDC_OP_ISSUER", default="")
OIDC_OP_AUTHORIZATION_ENDPOINT: str = env.str("OIDC_OP_AUTHORIZATION_ENDPOINT", default="")
OIDC_OP_TOKEN_ENDPOINT: str = env.str("OIDC_OP_TOKEN_ENDPOINT", default="")
OIDC_OP_USER_ENDPOINT: str = env.str("OIDC_OP_USER_ENDPOINT", default="")
OIDC_OP_JWKS_ENDPOINT: str = env.str("OIDC_OP_JWKS_ENDPOINT", default="")
OIDC_PROVIDER_NAME: str = env.str("OIDC_PROVIDER_NAME", default="single sign-on")
# Only these e-mail domains may sign in this way (lower case; empty = any the provider vouches for).
OIDC_ALLOWED_EMAIL_DOMAINS: list[str] = [
    domain.strip().lower().lstrip("@")
    for domain in env.list("OIDC_ALLOWED_EMAIL_DOMAINS", default=[])
    if domain.strip()
]
# When on, the login page offers only the provider; passwords still work for superusers (the way
# in when the provider is down), behind "Log in with a password".
OIDC_PASSWORD_LOGIN_SUPERUSERS_ONLY = env.bool("OIDC_PASSWORD_LOGIN_SUPERUSERS_ONLY", default=False)
OIDC_TIMEOUT = env.float("OIDC_TIMEOUT_SECONDS", default=5.0)  # each call to the provider
OIDC_DISCOVERY_CACHE_SECONDS = env.int("OIDC_DISCOVERY_CACHE_SECONDS", default=3600)
# The client's secret in an HTTP Basic header (client_secret_basic) instead of the form body.
OIDC_TOKEN_USE_BASIC_AUTH = env.bool("OIDC_TOKEN_USE_BASIC_AUTH", default=False)
# The provider's groups as LeadRouter's roles: "provider group=Role[;Role...]" pairs, comma-
# separated; a role is a Django group ("Sales managers", "RevOps") or "staff" (the admin's staff
# status). Empty: roles stay as set in the admin. Set: each sign-in sets the person's mapped
# roles to exactly those their groups give (audit.sso), and a person given one gets a login.
OIDC_GROUPS_CLAIM = env.str("OIDC_GROUPS_CLAIM", default="groups")


def group_roles_parse(pairs: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """``OIDC_GROUP_ROLES`` as read by ``env.dict``: each provider group's roles."""
    mapping: dict[str, tuple[str, ...]] = {}
    for group, names in pairs.items():
        roles = tuple(dict.fromkeys(name.strip() for name in str(names).split(";") if name.strip()))
        if not group.strip() or not roles:
            raise ValueError(f"OIDC_GROUP_ROLES: the provider group {group!r} names no role")
        mapping[group.strip()] = roles
    return mapping


OIDC_GROUP_ROLES: dict[str, tuple[str, ...]] = group_roles_parse(
    env.dict("OIDC_GROUP_ROLES", default={})
)
OIDC_RP_SIGN_ALGO = "RS256"
OIDC_RP_SCOPES = "openid email profile"
OIDC_USE_PKCE = True
OIDC_CREATE_USER = False  # a rep's login is made by routing.rep_access.user_sso_login, no other
SSO_ENABLED = bool(OIDC_RP_CLIENT_ID)
_OIDC_ENDPOINTS = (
    OIDC_OP_AUTHORIZATION_ENDPOINT,
    OIDC_OP_TOKEN_ENDPOINT,
    OIDC_OP_USER_ENDPOINT,
    OIDC_OP_JWKS_ENDPOINT,
)
if SSO_ENABLED and not OIDC_RP_CLIENT_SECRET:
    raise ImproperlyConfigured("OIDC_RP_CLIENT_ID is set but OIDC_RP_CLIENT_SECRET is not.")
if SSO_ENABLED and not OIDC_OP_ISSUER and not all(_OIDC_ENDPOINTS):
    raise ImproperlyConfigured(
        "Single sign-on needs OIDC_OP_ISSUER, or all four of OIDC_OP_AUTHORIZATION_ENDPOINT, "
        "OIDC_OP_TOKEN_ENDPOINT, OIDC_OP_USER_ENDPOINT and OIDC_OP_JWKS_ENDPOINT."
    )
# Passwords first (Django's, keeping to OIDC_PASSWORD_LOGIN_SUPERUSERS_ONLY); the provider's is
# inert while single sign-on is off. Django's own stays last so that sessions logged in before
# these two existed stay logged in (it is never reached by a password the first one refused).
AUTHENTICATION_BACKENDS = [
    "audit.sso.PasswordBackend",
    "audit.sso.SsoBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# --- end Pages

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(VAR_DIR / "static")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # WhiteNoise's compressed manifest storage; without a manifest (collectstatic not run) pages
    # still render and `check --deploy` and /readyz say what to run (config/staticfiles.py).
    "staticfiles": {"BACKEND": "config.staticfiles.StaticStorage"},
}

# --- HTTP API -------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "routing.config_api.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "config.errors.api_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "LeadRouter API",
    "DESCRIPTION": "Lead intake, lead lookup, routing simulation and alerts.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The lead status URL is a plain async view (leads.status_api): its operations are added.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "leads.openapi.status_paths_add",
    ],
}

# --- Celery ---------------------------------------------------------------------------------
# The lead row is the source of truth and the outbox; the broker only carries ids. Settings follow
# the reliability guide: late acks, requeue on a lost worker, prefetch 1, time limits well inside
# the visibility timeout, JSON only, no result backend.
REDIS_URL: str = env.str("REDIS_URL", default="")
CELERY_BROKER_URL: str = env.str("CELERY_BROKER_URL", default="") or REDIS_URL or "filesystem://"
BROKER_IS_FILESYSTEM = CELERY_BROKER_URL.startswith("filesystem://")
BROKER_DIR = Path(env.str("LEADROUTER_BROKER_DIR", default=str(VAR_DIR / "broker")))
# A worker on the filesystem broker checks this often that its folders still exist, and exits
# (70) when they are gone (config/celery.py).
BROKER_FOLDER_CHECK_SECONDS = env.float("BROKER_FOLDER_CHECK_SECONDS", default=2.0)

CELERY_TASK_TIME_LIMIT = env.int("CELERY_TASK_TIME_LIMIT", default=120)
CELERY_TASK_SOFT_TIME_LIMIT = env.int(
    "CELERY_TASK_SOFT_TIME_LIMIT", default=max(1, CELERY_TASK_TIME_LIMIT - 20)
)
CELERY_VISIBILITY_TIMEOUT = env.int(
    "CELERY_VISIBILITY_TIMEOUT", default=max(300, 2 * CELERY_TASK_TIME_LIMIT + 60)
)

CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any]
if BROKER_IS_FILESYSTEM:
    for _sub in ("queue", "processed", "control"):
        (BROKER_DIR / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
        "control_folder": str(BROKER_DIR / "control"),
        # kombu's default is a second between polls of an empty queue, which makes a worker
        # idle for up to a second after each quiet moment; a tenth is cheap on a local folder.
        "polling_interval": 0.1,
    }
    # kombu's filesystem transport, but a worker takes its queues in order (the first with a
    # message wins), as on Redis below: realtime lanes first (config/broker_filesystem.py).
    CELERY_BROKER_TRANSPORT = "config.broker_filesystem:Transport"
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": CELERY_VISIBILITY_TIMEOUT,
        # A publish must never hang a web request when Redis is down or paused.
        "socket_connect_timeout": env.float("BROKER_CONNECT_TIMEOUT", default=0.5),
        "socket_timeout": env.float("BROKER_SOCKET_TIMEOUT", default=2.0),
        "retry_on_timeout": False,
        "health_check_interval": 30,
        # A worker takes its queues in the order its -Q lists them (the first with a message
        # wins), not in turn: realtime lanes first (leads.lanes, docs/operations.md, "Queues
        # and workers"). kombu's default, round_robin, would take a bulk message as often.
        "queue_order_strategy": env.str("BROKER_QUEUE_ORDER", default="priority"),
    }

CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
# Applies on SIGQUIT (docker-compose.yml stops workers with stop_signal: SIGQUIT): running
# tasks get this long, then are requeued. A plain SIGTERM waits for running tasks without limit.
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = env.float("CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT", default=20.0)
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Worker processes run at this OS niceness (0 to 19; at least, a worker started nicer stays so),
# so that on a host shared with the web processes a spike is accepted at its own rate while
# routing catches up (issue 18). 0 leaves the priority as started.
WORKER_NICE = env.int("WORKER_NICE", default=10)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_TIMEOUT = env.float("BROKER_CONNECT_TIMEOUT", default=0.5)
CELERY_TASK_PUBLISH_RETRY = True
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
CELERY_TIMEZONE = "UTC"
# Celery closes Django's connection around every task unless told to reuse it (3x slower).
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=1000)

# Every queue the project uses; `celery -A config worker` with no -Q consumes all of them, in
# this order (on Redis the first queue with a message wins: see BROKER_QUEUE_ORDER). Separate
# queues keep slow enrichment or delivery from stalling routing, and the lanes (leads.lanes)
# keep a bulk backlog from holding up a realtime lead: routing.realtime, routing (normal) and
# routing.bulk; enrichment.realtime and crm.realtime beside enrichment and crm.
CELERY_TASK_QUEUES = tuple(
    Queue(name, Exchange(name, type="direct"), routing_key=name)
    for name in (
        "routing.realtime",
        "enrichment.realtime",
        "crm.realtime",
        "maintenance",
        "delivery",
        "routing",
        "enrichment",
        "crm",
        "routing.bulk",
    )
)
CELERY_TASK_DEFAULT_QUEUE = "routing"
CELERY_TASK_ROUTES = {
    "routing.*": {"queue": "routing"},
    "enrichment.*": {"queue": "enrichment"},
    "crm.*": {"queue": "crm"},
    "delivery.*": {"queue": "delivery"},
    "maintenance.*": {"queue": "maintenance"},
}
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# Periodic jobs are declared here; the database scheduler mirrors them into the admin.
# A heartbeat goes into every queue so that a queue nobody drains is noticed (see QueueHeartbeat).
CELERY_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    f"heartbeat-{queue.name}": {
        "task": "maintenance.heartbeat",
        "schedule": env.float("HEARTBEAT_INTERVAL_SECONDS", default=30.0),
        "args": [queue.name],
        "options": {"queue": queue.name, "expires": 120},
    }
    for queue in CELERY_TASK_QUEUES
}
CELERY_BEAT_SCHEDULE["requeue-stale-leads"] = {
    "task": "maintenance.requeue_stale",
    "schedule": env.float("REQUEUE_STALE_INTERVAL_SECONDS", default=30.0),
    "options": {"expires": 60},
}

# --- Logging, errors ------------------------------------------------------------------------
LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")
LOG_FORMAT = env.str("LOG_FORMAT", default="text")
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {
            "()": "config.logging.ContextTextFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
        },
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
    },
    "filters": {
        "redact_tokens": {"()": "config.logging.RedactTokensFilter"},
        # lead_id, source and task_id as fields of every record about a lead (config/logging.py)
        "log_context": {"()": "config.logging.LogContextFilter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "text",
            "filters": ["redact_tokens", "log_context"],
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        # Every 4xx is a WARNING there: a 401/429 storm would flood the logs. 5xx stay ERROR.
        "django.request": {"level": "ERROR"},
        "gunicorn.access": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}

SENTRY_DSN = env.str("SENTRY_DSN", default="")
if SENTRY_DSN:
    import sentry_sdk

    from config.logging import sentry_scrub_tokens

    sentry_sdk.init(
        dsn=SENTRY_DSN,
        before_send=sentry_scrub_tokens,
        before_send_transaction=sentry_scrub_tokens,
        environment=env.str("SENTRY_ENVIRONMENT", default="production"),
        traces_sample_rate=env.float("SENTRY_TRACES_SAMPLE_RATE", default=0.0),
        send_default_pii=False,
        # Frames hold request headers (`Authorization: Bearer …`) and token forms (a CRM's
        # client_secret): no local variables in any event (the scrubber drops them as well).
        include_local_variables=False,
    )

# --- LeadRouter ------------------------------------------------------------------------------
# Cache: the per-source intake rate limit lives here. Use Redis (a database other than the
# broker's) whenever more than one web process runs, or each process counts on its own.
CACHES = {"default": env.cache("CACHE_URL", default="locmemcache://")}

# Intake (api.md). Bodies are read and checked by leads.parsing, not by DRF's parsers.
INTAKE_MAX_BODY_BYTES = env.int("INTAKE_MAX_BODY_BYTES", default=1024 * 1024)
INTAKE_MAX_BATCH = env.int("INTAKE_MAX_BATCH", default=1000)
INTAKE_MAX_BATCH_BODY_BYTES = env.int("INTAKE_MAX_BATCH_BODY_BYTES", default=16 * 1024 * 1024)
INTAKE_MAX_JSON_DEPTH = env.int("INTAKE_MAX_JSON_DEPTH", default=32)
INTAKE_MAX_KEYS = env.int("INTAKE_MAX_KEYS", default=1000)
INTAKE_MAX_STRING_CHARS = env.int("INTAKE_MAX_STRING_CHARS", default=64 * 1024)
# Configuration API bodies (api.md, "Body limits"): a whole configuration of 20,000+
# territories and its CSV imports, so larger than one lead's; nesting stays INTAKE_MAX_JSON_DEPTH.
CONFIG_API_MAX_BODY_BYTES = env.int("CONFIG_API_MAX_BODY_BYTES", default=16 * 1024 * 1024)
CONFIG_API_MAX_STRING_CHARS = env.int("CONFIG_API_MAX_STRING_CHARS", default=16 * 1024 * 1024)
CONFIG_API_MAX_ITEMS = env.int("CONFIG_API_MAX_ITEMS", default=100_000)
SOURCE_TOKEN_OVERLAP_HOURS = env.int("SOURCE_TOKEN_OVERLAP_HOURS", default=48)
# Web processes keep a source's settings this long; a rotation or deactivation takes effect
# everywhere within it.
SOURCE_CACHE_SECONDS = env.float("SOURCE_CACHE_SECONDS", default=5.0)

# --- Lead status URLs (leads.status): what the page that submitted a lead may learn -----------
# The status URL's origin in the 202 (the ASGI process that serves it, e.g. behind a proxy that
# sends /api/v1/status/ there); empty: a path on the intake's own origin.
STATUS_BASE_URL: str = env.str("STATUS_BASE_URL", default="").rstrip("/")
# The longest ?wait= a status request may hold (seconds, at most 10); longer waits are clamped.
STATUS_WAIT_MAX_SECONDS = min(env.float("STATUS_WAIT_MAX_SECONDS", default=10.0), 10.0)
# Requests one status process lets wait for the same lead at once; more are answered at once
# (a page waits with one; a script holding thousands open for one lead gets no waiting slots).
STATUS_MAX_WAITERS_PER_LEAD = max(1, env.int("STATUS_MAX_WAITERS_PER_LEAD", default=4))
# Threads of the status process that read leads, each on one database connection kept between
# reads: the most connections the status process holds, however many requests wait.
STATUS_READ_THREADS = max(1, env.int("STATUS_READ_THREADS", default=4))
# How a worker wakes the status requests waiting for a lead: Redis pub/sub on this server (default
# REDIS_URL), else a datagram to each waiting process's socket in STATUS_WAKE_DIR (no server).
STATUS_REDIS_URL: str = env.str("STATUS_REDIS_URL", default="") or REDIS_URL
STATUS_CHANNEL: str = env.str("STATUS_CHANNEL", default="leadrouter:lead-status")
STATUS_WAKE_DIR = Path(env.str("LEADROUTER_STATUS_WAKE_DIR", default=str(VAR_DIR / "wake")))
# The status process's pub/sub listener pings Redis every STATUS_LISTENER_PING_SECONDS; heard
# nothing for that plus STATUS_LISTENER_TIMEOUT_SECONDS (a half-open connection, a hung server),
# it drops the connection and subscribes again, retrying with backoff up to ..._BACKOFF_MAX_SECONDS.
STATUS_LISTENER_PING_SECONDS = max(0.2, env.float("STATUS_LISTENER_PING_SECONDS", default=2.0))
STATUS_LISTENER_TIMEOUT_SECONDS = max(
    0.2, env.float("STATUS_LISTENER_TIMEOUT_SECONDS", default=2.0)
)
STATUS_LISTENER_BACKOFF_MAX_SECONDS = max(
    0.5, env.float("STATUS_LISTENER_BACKOFF_MAX_SECONDS", default=10.0)
)

# Django refuses (400) a body past this before any parser reads it: the largest of our limits.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(
    INTAKE_MAX_BODY_BYTES, INTAKE_MAX_BATCH_BODY_BYTES, CONFIG_API_MAX_BODY_BYTES
)
FILE_UPLOAD_MAX_MEMORY_SIZE = INTAKE_MAX_BATCH_BODY_BYTES
DATA_UPLOAD_MAX_NUMBER_FIELDS = INTAKE_MAX_KEYS
# The refused inbox (leads.inbox): refusals kept per source, and the alert when a source's
# refusals in the window reach the threshold (a tool whose payload shape changed).
REFUSED_INBOX_PER_SOURCE = env.int("REFUSED_INBOX_PER_SOURCE", default=1000)
REFUSED_ALERT_THRESHOLD = env.int("REFUSED_ALERT_THRESHOLD", default=10)
REFUSED_ALERT_WINDOW_MINUTES = env.int("REFUSED_ALERT_WINDOW_MINUTES", default=60)

# Durability: the stale sweeper, the publish circuit breaker, the poison-lead bound.
REQUEUE_STALE_AFTER_SECONDS = env.int("REQUEUE_STALE_AFTER_SECONDS", default=120)
REQUEUE_STALE_BATCH_SIZE = env.int("REQUEUE_STALE_BATCH_SIZE", default=500)
BROKER_BREAKER_SECONDS = env.float("BROKER_BREAKER_SECONDS", default=30.0)
# Lead ids per message when a batch is enqueued (one publish per chunk, not per lead).
ENQUEUE_CHUNK_SIZE = env.int("ENQUEUE_CHUNK_SIZE", default=100)
# A worker working on a chunk for this long hands the leads it has not reached back to their
# lane's queue (at its back), so a realtime lead waits for at most this, not a whole chunk
# (leads.lanes; docs/operations.md, "Queues and workers"). 0: a chunk runs to its end.
ROUTING_CHUNK_SLICE_SECONDS = env.float("ROUTING_CHUNK_SLICE_SECONDS", default=1.0)
# A chunk also asks this often whether a realtime routing message waits, and hands
# the rest back at once when one does (leads.services.RealtimePeek). 0: the time slice only.
ROUTING_CHUNK_PEEK_SECONDS = env.float("ROUTING_CHUNK_PEEK_SECONDS", default=0.1)
# A chunk's leads are routed in batches of this many, one routing transaction each, with
# what they share read and written once (routing.batch; docs/benchmarks.md). 1: one by one.
ROUTING_BATCH_SIZE = env.int("ROUTING_BATCH_SIZE", default=50)
# A worker taking one lead's message routes it together with up to ROUTING_BATCH_SIZE - 1 other
# leads waiting in its lane (routing.batch.lead_process_batched): a batch of one at low traffic,
# growing by itself under a spike. False: one lead a message.
ROUTING_BATCH_WAITING = env.bool("ROUTING_BATCH_WAITING", default=True)
# The kickoff hands committed lead ids to a publisher thread and answers at once, so a down,
# hung or slow broker never delays a request. False publishes inline, after commit.
ENQUEUE_IN_BACKGROUND = env.bool("ENQUEUE_IN_BACKGROUND", default=True)
# On a Redis broker the routing messages are LPUSHed as prebuilt Celery messages, all of a publish
# in one round trip (leads.broker_publish: ~0.1 ms instead of ~0.8 ms for send_task). False sends
# them through kombu, as any other broker does.
ENQUEUE_RAW_REDIS = env.bool("ENQUEUE_RAW_REDIS", default=True)
LEAD_MAX_ATTEMPTS = env.int("LEAD_MAX_ATTEMPTS", default=3)
# Putting a lead off (lock contention, its original still waiting for enrichment) is not an
# attempt; it is retried after a growing delay (0.5 s doubling, at most 60 s), this many times.
LEAD_MAX_DEFERRALS = env.int("LEAD_MAX_DEFERRALS", default=30)
# After a failed attempt the lead is retried after 5 s, 20 s, 80 s... (at most 120 s).
LEAD_RETRY_BACKOFF_SECONDS = env.float("LEAD_RETRY_BACKOFF_SECONDS", default=5.0)
# How long a worker holds a lead it claimed; past it (a dead worker) the lead is claimable again.
LEAD_LEASE_SECONDS = env.int("LEAD_LEASE_SECONDS", default=CELERY_TASK_TIME_LIMIT + 30)

# Worker database sessions (PostgreSQL): a lock wait, a statement, or an idle transaction
# longer than these is cut off, so one stuck lock cannot freeze the pipeline.
WORKER_DB_LOCK_TIMEOUT_MS = env.int("WORKER_DB_LOCK_TIMEOUT_MS", default=5_000)
WORKER_DB_STATEMENT_TIMEOUT_MS = env.int("WORKER_DB_STATEMENT_TIMEOUT_MS", default=30_000)
WORKER_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS = env.int(
    "WORKER_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", default=60_000
)

# The key that signs exported audit chain heads (audit_export_heads); keep it out of the database.
AUDIT_HEADS_KEY = env.str("AUDIT_HEADS_KEY", default="")
# Nightly (AUDIT_HEADS_EXPORT_AT, UTC), beat has a worker write the signed chain heads into
# AUDIT_HEADS_DIR, keeping the newest AUDIT_HEADS_KEEP files (0: all). Ship them off the host.
AUDIT_HEADS_DIR = Path(env.str("AUDIT_HEADS_DIR", default=str(VAR_DIR / "audit-heads")))
AUDIT_HEADS_KEEP = env.int("AUDIT_HEADS_KEEP", default=30)
AUDIT_HEADS_EXPORT_AT = env.str("AUDIT_HEADS_EXPORT_AT", default="02:30")
try:
    _heads_hour, _heads_minute = (int(part) for part in AUDIT_HEADS_EXPORT_AT.split(":"))
    if not (0 <= _heads_hour < 24 and 0 <= _heads_minute < 60):
        raise ValueError(AUDIT_HEADS_EXPORT_AT)
except ValueError:
    raise ImproperlyConfigured(
        f"AUDIT_HEADS_EXPORT_AT must be a UTC time HH:MM, not {AUDIT_HEADS_EXPORT_AT!r}"
    ) from None
# Nightly: verify every chain and last night's heads file (an `audit` alert on findings), then
# export tonight's heads.
CELERY_BEAT_SCHEDULE["audit-export-heads"] = {
    "task": "maintenance.audit_nightly",
    "schedule": crontab(hour=str(_heads_hour), minute=str(_heads_minute)),
    "options": {"queue": "maintenance", "expires": 6 * 3600},
}
# `manage.py flush` would erase the audit log: refused unless this is on. Deliberately not read
# from the environment; only the test settings turn it on (transactional tests flush).
AUDIT_ALLOW_FLUSH = False

# Routing: duplicates are matched against leads of the last DEDUP_WINDOW_DAYS; an assignment
# whose rule, tag rule and team name no SLA gets DEFAULT_SLA_MINUTES.
DEDUP_WINDOW_DAYS = env.int("DEDUP_WINDOW_DAYS", default=90)
# A rep becoming unavailable (deactivated, out of office, a planned absence starting; from the
# admin, an import or beat) also routes their untouched leads to someone else: up to
# REROUTE_INLINE_MAX_LEADS at once, more as a background admin job. Beat looks for absences
# that have started, and holidays that have begun, every ABSENCE_START_INTERVAL_SECONDS.
REROUTE_OPEN_LEADS_ON_ABSENCE = env.bool("REROUTE_OPEN_LEADS_ON_ABSENCE", default=True)
REROUTE_INLINE_MAX_LEADS = env.int("REROUTE_INLINE_MAX_LEADS", default=25)
ABSENCE_START_INTERVAL_SECONDS = env.float("ABSENCE_START_INTERVAL_SECONDS", default=60.0)
CELERY_BEAT_SCHEDULE["absences-start"] = {
    "task": "maintenance.absences_start",
    "schedule": ABSENCE_START_INTERVAL_SECONDS,
    "options": {"expires": max(30.0, ABSENCE_START_INTERVAL_SECONDS)},
}
DEFAULT_SLA_MINUTES = env.int("DEFAULT_SLA_MINUTES", default=60)

# Admin replays and CSV imports: up to the *_SYNC_* size they run while the page loads; larger
# ones run as a background job on the maintenance queue, with a progress page. A job that no
# worker has reported on for ADMIN_JOB_STALE_SECONDS is shown as stalled (an error, not a
# spinner); ADMIN_JOB_TIME_LIMIT_SECONDS bounds one run.
REPLAY_SYNC_MAX_LEADS = env.int("REPLAY_SYNC_MAX_LEADS", default=500)
REPLAY_MAX_LEADS = env.int("REPLAY_MAX_LEADS", default=50_000)
ADMIN_IMPORT_SYNC_MAX_ROWS = env.int("ADMIN_IMPORT_SYNC_MAX_ROWS", default=2_000)
ADMIN_IMPORT_MAX_BYTES = env.int("ADMIN_IMPORT_MAX_BYTES", default=20 * 1024 * 1024)
ADMIN_JOB_STALE_SECONDS = env.int("ADMIN_JOB_STALE_SECONDS", default=120)
ADMIN_JOB_TIME_LIMIT_SECONDS = env.int("ADMIN_JOB_TIME_LIMIT_SECONDS", default=900)
# A job claimed again after its worker stopped is tried at most this many times in all.
ADMIN_JOB_MAX_ATTEMPTS = env.int("ADMIN_JOB_MAX_ATTEMPTS", default=3)

READYZ_BROKER_TIMEOUT_SECONDS = env.float("READYZ_BROKER_TIMEOUT_SECONDS", default=2.0)
DB_UNAVAILABLE_RETRY_AFTER_SECONDS = env.int("DB_UNAVAILABLE_RETRY_AFTER_SECONDS", default=30)

# --- Delivery -------------------------------------------------------------------------------
# Outbound webhooks and e-mail to the rep after each assignment (routing/delivery, docs/api.md
# "Outbound webhooks"). Retries are rows with a due time, swept by beat, never long countdowns.
# Webhook URLs resolving to loopback, private, link-local or other non-public addresses are
# refused at save and at send unless this is on (a receiver on the same private network).
DELIVERY_ALLOW_PRIVATE_URLS = env.bool("DELIVERY_ALLOW_PRIVATE_URLS", default=False)
DELIVERY_TIMEOUT_SECONDS = env.float("DELIVERY_TIMEOUT_SECONDS", default=10.0)
# A failing delivery is retried with exponential backoff and full jitter (base doubling per
# attempt, capped) until this long after it was created; then it is marked failed.
DELIVERY_MAX_AGE_SECONDS = env.int("DELIVERY_MAX_AGE_SECONDS", default=24 * 3600)
DELIVERY_BACKOFF_BASE_SECONDS = env.float("DELIVERY_BACKOFF_BASE_SECONDS", default=30.0)
DELIVERY_BACKOFF_MAX_SECONDS = env.float("DELIVERY_BACKOFF_MAX_SECONDS", default=3600.0)
# How long an attempt holds its delivery; a worker that dies mid-attempt frees it after this.
DELIVERY_LEASE_SECONDS = env.int(
    "DELIVERY_LEASE_SECONDS", default=int(DELIVERY_TIMEOUT_SECONDS) + 50
)
DELIVERY_EMAIL_ENABLED = env.bool("DELIVERY_EMAIL_ENABLED", default=True)
DELIVERY_SWEEP_INTERVAL_SECONDS = env.float("DELIVERY_SWEEP_INTERVAL_SECONDS", default=15.0)
DELIVERY_SWEEP_BATCH_SIZE = env.int("DELIVERY_SWEEP_BATCH_SIZE", default=200)
# A due delivery whose task was published this recently is not published again by the sweeper.
DELIVERY_REDISPATCH_SECONDS = env.int("DELIVERY_REDISPATCH_SECONDS", default=60)
# Base of the link in e-mails to reps (e.g. https://leads.example.com); empty = a bare path.
DELIVERY_LINK_BASE_URL = env.str("DELIVERY_LINK_BASE_URL", default="")
# How long the one-click "I'm on it" link in a rep's e-mail or chat message works (it works once).
TOUCH_LINK_MAX_AGE_SECONDS = env.int("TOUCH_LINK_MAX_AGE_SECONDS", default=7 * 24 * 3600)
# How long the set-password link of a rep's invitation works (Django's own setting).
PASSWORD_RESET_TIMEOUT = env.int("PASSWORD_RESET_TIMEOUT", default=3 * 24 * 3600)
# Where slack-sdk's WebClient sends a bot's Web API calls (users.lookupByEmail, chat.postMessage);
# change it only for a proxy or a test server.
SLACK_API_BASE_URL = env.str("SLACK_API_BASE_URL", default="https://slack.com/api/")
# Priorities (as tag rules name them, any case) whose leads are taken first: their deliveries
# (webhooks, e-mail, CRM write-back) go ahead of others waiting in the delivery queue, on Redis
# (docs/operations.md, "Priority"). Comma-separated; empty turns the fast lane off.
HIGH_PRIORITIES: list[str] = env.list("HIGH_PRIORITIES", default=["hot", "urgent", "high"])
# E-mail: EMAIL_URL such as smtp+tls://user:password@smtp.example.com:587; the default prints
# mails to the worker's console, so a laptop install does not retry an absent SMTP server.
vars().update(env.email_url("EMAIL_URL", default="consolemail://"))
# A mail server that accepts and never answers must not hang a worker or the beat watchdog.
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="LeadRouter <leadrouter@localhost>")
CELERY_BEAT_SCHEDULE["delivery-sweep-due"] = {
    "task": "delivery.sweep_due",
    "schedule": DELIVERY_SWEEP_INTERVAL_SECONDS,
    "options": {"expires": 2 * DELIVERY_SWEEP_INTERVAL_SECONDS},
}

# --- Enrichment ------------------------------------------------------------------------------
# Providers run in this order. Built-ins (account, email, geo) run in the routing worker; `http`
# runs on the `enrichment` queue and is off while ENRICHMENT_HTTP_URL is empty. See
# docs/operations.md, "Enrichment".
ENRICHMENT_PROVIDERS: list[str] = env.list(
    "ENRICHMENT_PROVIDERS", default=["account", "email", "geo", "http"]
)
ENRICHMENT_HTTP_URL: str = env.str("ENRICHMENT_HTTP_URL", default="")
ENRICHMENT_HTTP_HEADERS: dict[str, str] = env.json("ENRICHMENT_HTTP_HEADERS", default={})
ENRICHMENT_HTTP_TIMEOUT_SECONDS = env.float("ENRICHMENT_HTTP_TIMEOUT_SECONDS", default=10.0)
ENRICHMENT_HTTP_MAX_BODY_BYTES = env.int("ENRICHMENT_HTTP_MAX_BODY_BYTES", default=64 * 1024)
# The provider's quota, shared by every worker (a Redis token bucket; `burst` at once at most).
ENRICHMENT_HTTP_RATE_PER_MINUTE = env.int("ENRICHMENT_HTTP_RATE_PER_MINUTE", default=60)
ENRICHMENT_HTTP_BURST = env.int(
    "ENRICHMENT_HTTP_BURST", default=max(1, ENRICHMENT_HTTP_RATE_PER_MINUTE // 60)
)
# The share of each vendor's rate limit (HTTP enrichment, each CRM connection, Meta's fetch)
# kept for realtime leads (leads.lanes): other leads' calls leave this share of the burst,
# rounded up, untaken on top of the burst (Redis; realtime calls may exceed the burst by it) or
# inside the minute's budget (cache), so a bulk backlog cannot use it up.
REALTIME_RESERVED_SHARE = env.float("REALTIME_RESERVED_SHARE", default=0.2)
# Tries per lead (5xx, timeouts, 429s), backoff base and cap; past the max wait since its first
# try a lead is routed without the provider, whatever held it up.
ENRICHMENT_HTTP_MAX_ATTEMPTS = env.int("ENRICHMENT_HTTP_MAX_ATTEMPTS", default=5)
ENRICHMENT_HTTP_BACKOFF_SECONDS = env.float("ENRICHMENT_HTTP_BACKOFF_SECONDS", default=5.0)
ENRICHMENT_HTTP_BACKOFF_MAX_SECONDS = env.float(
    "ENRICHMENT_HTTP_BACKOFF_MAX_SECONDS", default=300.0
)
ENRICHMENT_HTTP_MAX_WAIT_SECONDS = env.float("ENRICHMENT_HTTP_MAX_WAIT_SECONDS", default=900.0)
# Circuit breaker shared by every worker: opens after this many failures in a row, half-open
# (one probe call) after the cool-down.
ENRICHMENT_BREAKER_FAILURES = env.int("ENRICHMENT_BREAKER_FAILURES", default=5)
ENRICHMENT_BREAKER_COOLDOWN_SECONDS = env.float("ENRICHMENT_BREAKER_COOLDOWN_SECONDS", default=60.0)
# Where the rate limit and breaker live: default the cache's Redis, else REDIS_URL.
ENRICHMENT_REDIS_URL: str = env.str("ENRICHMENT_REDIS_URL", default="")
ENRICHMENT_STORE_DOWN_RETRY_SECONDS = env.float("ENRICHMENT_STORE_DOWN_RETRY_SECONDS", default=10.0)
# A try holds its lead this long (longer than a call can take); a dead worker's try is redone.
ENRICHMENT_LEASE_SECONDS = env.int(
    "ENRICHMENT_LEASE_SECONDS", default=int(ENRICHMENT_HTTP_TIMEOUT_SECONDS) + 30
)
# One enrichment task claims its lead and up to BATCH_SIZE - 1 other due ones, and calls the
# provider for them with up to HTTP_CONCURRENCY calls in flight in its process.
ENRICHMENT_BATCH_SIZE = env.int("ENRICHMENT_BATCH_SIZE", default=32)
ENRICHMENT_HTTP_CONCURRENCY = env.int("ENRICHMENT_HTTP_CONCURRENCY", default=16)
# A parked lead outside the realtime lane is sent to the enrichment queue this late, so that
# leads parked one at a time meanwhile are called together by one task (0: at once).
ENRICHMENT_GATHER_SECONDS = env.float("ENRICHMENT_GATHER_SECONDS", default=0.3)
ENRICHMENT_SWEEP_INTERVAL_SECONDS = env.float("ENRICHMENT_SWEEP_INTERVAL_SECONDS", default=10.0)
ENRICHMENT_SWEEP_BATCH_SIZE = env.int("ENRICHMENT_SWEEP_BATCH_SIZE", default=200)
# A finished lead that routing has not taken this long after is handed back again.
ENRICHMENT_HANDBACK_RETRY_SECONDS = env.int("ENRICHMENT_HANDBACK_RETRY_SECONDS", default=60)
CELERY_IMPORTS: tuple[str, ...] = (
    "routing.enrichment.tasks",
    "routing.crm.tasks",
    "routing.timeoff.tasks",
)
CELERY_BEAT_SCHEDULE["enrichment-sweep-due"] = {
    "task": "enrichment.sweep_due",
    "schedule": ENRICHMENT_SWEEP_INTERVAL_SECONDS,
    "options": {"expires": max(5.0, ENRICHMENT_SWEEP_INTERVAL_SECONDS)},
}

# --- Meta Lead Ads: fetching the lead a leadgen notification names (routing/fetch/meta.py) -----
# On the `enrichment` queue. Meta's Lead Ads limit is per Page and day (200 x 24 x leads of the
# last 90 days); this budget per source keeps a burst of notifications polite. Meta's own
# throttling (codes 4, 17, 32, 613, 80001-80014) pauses it for estimated_time_to_regain_access.
META_GRAPH_TIMEOUT_SECONDS = env.float("META_GRAPH_TIMEOUT_SECONDS", default=10.0)
META_GRAPH_CA_BUNDLE: str = env.str("META_GRAPH_CA_BUNDLE", default="")
META_GRAPH_RATE_PER_MINUTE = env.int("META_GRAPH_RATE_PER_MINUTE", default=120)
META_GRAPH_BURST = env.int("META_GRAPH_BURST", default=10)
META_BREAKER_FAILURES = env.int("META_BREAKER_FAILURES", default=5)
META_BREAKER_COOLDOWN_SECONDS = env.float("META_BREAKER_COOLDOWN_SECONDS", default=60.0)
# A lead not fetched after this many tries (timeouts, 5xx) or this long is failed, with the
# reason, for an operator to retry; a refused token waits (an alert) and does not count.
META_FETCH_MAX_ATTEMPTS = env.int("META_FETCH_MAX_ATTEMPTS", default=10)
META_FETCH_MAX_WAIT_SECONDS = env.float("META_FETCH_MAX_WAIT_SECONDS", default=6 * 3600.0)
META_FETCH_BACKOFF_SECONDS = env.float("META_FETCH_BACKOFF_SECONDS", default=5.0)
META_FETCH_AUTH_RETRY_SECONDS = env.float("META_FETCH_AUTH_RETRY_SECONDS", default=600.0)
# Leads waiting longer than this for their fetch (not for a token) open an enrichment alert.
META_FETCH_ALERT_AFTER_SECONDS = env.float("META_FETCH_ALERT_AFTER_SECONDS", default=900.0)
META_FETCH_LEASE_SECONDS = env.int(
    "META_FETCH_LEASE_SECONDS", default=int(META_GRAPH_TIMEOUT_SECONDS) + 30
)
META_FETCH_SWEEP_INTERVAL_SECONDS = env.float("META_FETCH_SWEEP_INTERVAL_SECONDS", default=10.0)
META_FETCH_SWEEP_BATCH_SIZE = env.int("META_FETCH_SWEEP_BATCH_SIZE", default=200)
CELERY_IMPORTS = (*CELERY_IMPORTS, "routing.fetch.tasks")
CELERY_BEAT_SCHEDULE["meta-fetch-sweep-due"] = {
    "task": "enrichment.meta_fetch_sweep",
    "schedule": META_FETCH_SWEEP_INTERVAL_SECONDS,
    "options": {"expires": max(5.0, META_FETCH_SWEEP_INTERVAL_SECONDS)},
}

# --- Monitoring -------------------------------------------------------------------------------
# Alerts, SLA timers, the backlog watch and /metrics (routing/monitoring, docs/operations.md
# "Alerts and metrics"). Every check is also a management command (check_backlog, check_sla).
ALERT_WEBHOOK_URL: str = env.str("ALERT_WEBHOOK_URL", default="")
# slack: {"text": "..."} (Slack, Mattermost, Teams incoming webhooks); json: the alert document.
ALERT_WEBHOOK_FORMAT: str = env.str("ALERT_WEBHOOK_FORMAT", default="slack")
ALERT_WEBHOOK_TIMEOUT_SECONDS = env.float("ALERT_WEBHOOK_TIMEOUT_SECONDS", default=5.0)
# Like DELIVERY_ALLOW_PRIVATE_URLS: an alert webhook on loopback or a private network.
ALERT_ALLOW_PRIVATE_URLS = env.bool("ALERT_ALLOW_PRIVATE_URLS", default=False)
ALERT_EMAILS: list[str] = env.list("ALERT_EMAILS", default=[])
BACKLOG_CHECK_INTERVAL_SECONDS = env.float("BACKLOG_CHECK_INTERVAL_SECONDS", default=30.0)
BACKLOG_ALERT_DEPTH = env.int("BACKLOG_ALERT_DEPTH", default=500)
# A watched condition must stay clear this long before its alert resolves (no flapping).
ALERT_RESOLVE_AFTER_SECONDS = env.float("ALERT_RESOLVE_AFTER_SECONDS", default=90.0)
BACKLOG_ALERT_AGE_SECONDS = env.int("BACKLOG_ALERT_AGE_SECONDS", default=300)
# ... and a realtime-lane lead (leads.lanes: a form's prospect still on the page) this long.
BACKLOG_ALERT_REALTIME_AGE_SECONDS = env.int("BACKLOG_ALERT_REALTIME_AGE_SECONDS", default=60)
# The bulk lane (batch uploads, imports) is watched by limits of its own: a 10,000-lead webinar
# upload is a backlog by design, worked off in minutes, and is no reason to page anyone.
BACKLOG_ALERT_BULK_DEPTH = env.int("BACKLOG_ALERT_BULK_DEPTH", default=50_000)
BACKLOG_ALERT_BULK_AGE_SECONDS = env.int("BACKLOG_ALERT_BULK_AGE_SECONDS", default=3600)
# A queue whose heartbeat no worker executed for this long gets a `worker` alert (a queue that
# never had one counts from the first check). With heartbeats every 30 s and checks every 30 s,
# a worker that stops is reported within two minutes.
HEARTBEAT_STALE_SECONDS = env.int("HEARTBEAT_STALE_SECONDS", default=90)


# --- Personal data (leads/privacy.py; docs/operations.md "Privacy") -----------------------------
# The master keys that wrap each person's data key: Fernet keys, comma-separated, newest first
# (the first wraps, all unwrap; `manage.py privacy_rewrap` moves every person's key to the
# first). Empty = one generated under var/ on first use. Losing them loses every person's data.
_CONFIGURED_PRIVACY_KEYS = [k for k in env.list("PRIVACY_KEYS", default=[]) if k.strip()]
PRIVACY_KEYS: list[str] = _CONFIGURED_PRIVACY_KEYS or [
    _var_key("privacy-key", lambda: Fernet.generate_key().decode())
]
# The HMAC key of the lookup hashes that find a person's key by e-mail or phone (never stored
# plain). Changing it orphans existing keys from their people: set it once.
_CONFIGURED_PRIVACY_HASH_KEY = env.str("PRIVACY_HASH_KEY", default="")
PRIVACY_HASH_KEY: str = _CONFIGURED_PRIVACY_HASH_KEY or _var_key(
    "privacy-hash-key", lambda: secrets.token_urlsafe(32)
)
# Which of the two came from var/ (the embedded default): `manage.py check --deploy` refuses that
# (leadrouter.E002), since a key file beside the code travels with images and copies of it.
PRIVACY_KEYS_GENERATED: list[str] = [
    name
    for name, configured in (
        ("PRIVACY_KEYS", _CONFIGURED_PRIVACY_KEYS),
        ("PRIVACY_HASH_KEY", _CONFIGURED_PRIVACY_HASH_KEY),
    )
    if not configured
]
# Seal the personal content of audit events under per-person keys (crypto-shredding, issue 21).
# Off: no person keys are made and new events are stored plain, so an erasure cannot make their
# personal parts unreadable (it still overwrites the lead). For measuring the cost (bench.privacy)
# and nothing else: keep it on in production.
PRIVACY_SEALING = env.bool("PRIVACY_SEALING", default=True)
# How long a process may keep a person's unwrapped data key to open sealed audit data: one read
# per lead, not per event. An erasure clears its own process at once; others within this.
PRIVACY_KEY_CACHE_SECONDS = env.float("PRIVACY_KEY_CACHE_SECONDS", default=5.0)
# After a rotation (a new key first in PRIVACY_KEYS), beat re-wraps the person keys still under an
# older master key every PRIVACY_REWRAP_INTERVAL_SECONDS, a minute of work at a time.
PRIVACY_REWRAP_INTERVAL_SECONDS = env.float("PRIVACY_REWRAP_INTERVAL_SECONDS", default=300.0)
CELERY_BEAT_SCHEDULE["privacy-rewrap"] = {
    "task": "maintenance.privacy_rewrap",
    "schedule": PRIVACY_REWRAP_INTERVAL_SECONDS,
    "options": {"expires": max(60.0, PRIVACY_REWRAP_INTERVAL_SECONDS)},
}

# --- Retention (routing/retention/; docs/operations.md "Retention") -----------------------------
# Days from a lead's receipt after which the retention job prunes: the payload as received (and
# refused inbox rows), the personal fields of leads that never got an owner, the personal fields
# of every lead. 0 = kept (the default: choose your periods). Each source may set its own.
RETENTION_RAW_PAYLOAD_DAYS = env.int("RETENTION_RAW_PAYLOAD_DAYS", default=0)
RETENTION_UNROUTED_DAYS = env.int("RETENTION_UNROUTED_DAYS", default=0)
RETENTION_PERSONAL_DAYS = env.int("RETENTION_PERSONAL_DAYS", default=0)
# Beat runs the job every RETENTION_INTERVAL_SECONDS; a run prunes RETENTION_BATCH_SIZE leads per
# transaction and stops after RETENTION_MAX_SECONDS (the next run carries on).
RETENTION_INTERVAL_SECONDS = env.float("RETENTION_INTERVAL_SECONDS", default=900.0)
RETENTION_BATCH_SIZE = env.int("RETENTION_BATCH_SIZE", default=200)
RETENTION_MAX_SECONDS = env.float("RETENTION_MAX_SECONDS", default=120.0)
# A person key whose last lead was pruned is destroyed this long after (a lead being normalised
# at that moment may still take it).
RETENTION_KEY_GRACE_SECONDS = env.float("RETENTION_KEY_GRACE_SECONDS", default=3600.0)
CELERY_IMPORTS = (*CELERY_IMPORTS, "routing.retention.tasks")
CELERY_BEAT_SCHEDULE["retention-apply"] = {
    "task": "maintenance.retention_apply",
    "schedule": RETENTION_INTERVAL_SECONDS,
    "options": {"expires": max(60.0, RETENTION_INTERVAL_SECONDS)},
}


# --- CRM connections (routing/crm/; docs/operations.md "Connecting a CRM") -----------------------
# Fernet keys for the credentials stored in the database, comma-separated, the first encrypts;
# empty = a key derived from SECRET_KEY. Rotate: put a new key first, `manage.py crm_rotate_key`.
CRM_SECRET_KEYS: list[str] = env.list("CRM_SECRET_KEYS", default=[])
# Each socket operation of a CRM request (the connect, each read)...
CRM_TIMEOUT_SECONDS = env.float("CRM_TIMEOUT_SECONDS", default=10.0)
# ...and the whole request, connect to last byte: a CRM trickling its answer is cut off here
# (routing/deadline.py), so it cannot hold an I/O worker thread for longer.
CRM_CALL_DEADLINE_SECONDS = env.float("CRM_CALL_DEADLINE_SECONDS", default=CRM_TIMEOUT_SECONDS)
# A CA file to trust for CRM calls instead of the system's (a TLS-inspecting proxy, a sandbox).
CRM_CA_BUNDLE: str = env.str("CRM_CA_BUNDLE", default="")
# The lookup (live dedup and ownership) on the `crm` queue: how long a lead may wait for the CRM
# before it is routed without it, how many tries, and the retry backoff (doubling, jittered).
CRM_LOOKUP_MAX_WAIT_SECONDS = env.float("CRM_LOOKUP_MAX_WAIT_SECONDS", default=120.0)
CRM_LOOKUP_MAX_ATTEMPTS = env.int("CRM_LOOKUP_MAX_ATTEMPTS", default=4)
CRM_LOOKUP_BACKOFF_SECONDS = env.float("CRM_LOOKUP_BACKOFF_SECONDS", default=2.0)
CRM_LEASE_SECONDS = env.int("CRM_LEASE_SECONDS", default=int(CRM_CALL_DEADLINE_SECONDS * 4) + 30)
CRM_SWEEP_INTERVAL_SECONDS = env.float("CRM_SWEEP_INTERVAL_SECONDS", default=5.0)
CRM_SWEEP_BATCH_SIZE = env.int("CRM_SWEEP_BATCH_SIZE", default=200)
# A lookup message published this long ago and not run is taken as lost and published again.
CRM_REDISPATCH_SECONDS = env.float("CRM_REDISPATCH_SECONDS", default=60.0)
CRM_HANDBACK_RETRY_SECONDS = env.int("CRM_HANDBACK_RETRY_SECONDS", default=60)
CRM_CONFIG_CACHE_SECONDS = env.float("CRM_CONFIG_CACHE_SECONDS", default=5.0)
# The breaker shared by every worker: open after this many failures in a row, for this long.
CRM_BREAKER_FAILURES = env.int("CRM_BREAKER_FAILURES", default=5)
CRM_BREAKER_COOLDOWN_SECONDS = env.float("CRM_BREAKER_COOLDOWN_SECONDS", default=30.0)
# Health and its alert (routing.crm.health): checked every CRM_HEALTH_INTERVAL_SECONDS.
CRM_HEALTH_INTERVAL_SECONDS = env.float("CRM_HEALTH_INTERVAL_SECONDS", default=30.0)
CRM_DOWN_ALERT_SECONDS = env.float("CRM_DOWN_ALERT_SECONDS", default=60.0)
CRM_RATE_LIMIT_ALERT_SECONDS = env.float("CRM_RATE_LIMIT_ALERT_SECONDS", default=90.0)
CRM_HEALTH_PROBE_SECONDS = env.float("CRM_HEALTH_PROBE_SECONDS", default=300.0)
CRM_OK_WRITE_SECONDS = env.float("CRM_OK_WRITE_SECONDS", default=10.0)
# The roster (CRM owners mapped to reps by e-mail) is read again this often.
CRM_ROSTER_SYNC_SECONDS = env.float("CRM_ROSTER_SYNC_SECONDS", default=3600.0)
# First touch and owner changes read from the CRM for assigned, untouched leads.
CRM_TOUCHES_INTERVAL_SECONDS = env.float("CRM_TOUCHES_INTERVAL_SECONDS", default=60.0)
CRM_TOUCHES_BATCH_SIZE = env.int("CRM_TOUCHES_BATCH_SIZE", default=500)
CRM_TOUCHES_LOOKBACK_DAYS = env.int("CRM_TOUCHES_LOOKBACK_DAYS", default=14)
CELERY_BEAT_SCHEDULE["crm-sweep-due"] = {
    "task": "crm.sweep_due",
    "schedule": CRM_SWEEP_INTERVAL_SECONDS,
    "options": {"expires": max(5.0, CRM_SWEEP_INTERVAL_SECONDS)},
}
CELERY_BEAT_SCHEDULE["crm-health"] = {
    "task": "maintenance.crm_health",
    "schedule": CRM_HEALTH_INTERVAL_SECONDS,
    "options": {"expires": max(10.0, CRM_HEALTH_INTERVAL_SECONDS)},
}
CELERY_BEAT_SCHEDULE["crm-roster"] = {
    "task": "maintenance.crm_roster",
    "schedule": CRM_ROSTER_SYNC_SECONDS,
    "options": {"expires": 600},
}
CELERY_BEAT_SCHEDULE["crm-touches"] = {
    "task": "maintenance.crm_touches",
    "schedule": CRM_TOUCHES_INTERVAL_SECONDS,
    "options": {"expires": max(30.0, CRM_TOUCHES_INTERVAL_SECONDS)},
}

# `enrichment` alert: this many enrichment_failed events within the window, or the breaker open.
ENRICHMENT_ALERT_FAILURES = env.int("ENRICHMENT_ALERT_FAILURES", default=10)
ENRICHMENT_ALERT_WINDOW_SECONDS = env.int("ENRICHMENT_ALERT_WINDOW_SECONDS", default=600)
# Beat runs check_backlog in its own process too, so a dead broker or no worker at all (which
# would keep the check_backlog task itself from running) still ends in an alert.
BACKLOG_CHECK_IN_BEAT = env.bool("BACKLOG_CHECK_IN_BEAT", default=True)
SLA_CHECK_INTERVAL_SECONDS = env.float("SLA_CHECK_INTERVAL_SECONDS", default=60.0)
SLA_MAX_REASSIGNMENTS = env.int("SLA_MAX_REASSIGNMENTS", default=2)
SLA_CHECK_BATCH_SIZE = env.int("SLA_CHECK_BATCH_SIZE", default=500)
# One check_sla run handles at most this many due assignments (the next run carries on).
SLA_CHECK_MAX_PER_RUN = env.int("SLA_CHECK_MAX_PER_RUN", default=5000)
# ... and stops after this many seconds, well below the task's soft time limit (the next run
# carries on), so a slow run ends cleanly instead of being cut off mid-row.
SLA_CHECK_MAX_SECONDS = env.float("SLA_CHECK_MAX_SECONDS", default=60.0)
# An assignment whose SLA handling raised is retried after a pause (one interval, doubling, at
# most an hour) and never blocks the others; after this many failures an `sla` alert opens.
SLA_CHECK_ALERT_AFTER_FAILURES = env.int("SLA_CHECK_ALERT_AFTER_FAILURES", default=3)
# A rep is warned (e-mail, Slack, Teams) once when an untouched lead's SLA is this close to
# running out, or half of its SLA is left if that is shorter; 0 turns the warnings off.
SLA_WARNING_MINUTES = env.float("SLA_WARNING_MINUTES", default=10.0)
# An unassigned lead is routed again UNASSIGNED_RETRY_SECONDS after it became unassigned, then
# after twice as long each time it is still unassigned, at most UNASSIGNED_RETRY_MAX_SECONDS
# apart. Beat looks for due leads every UNASSIGNED_RETRY_SECONDS.
UNASSIGNED_RETRY_SECONDS = env.float("UNASSIGNED_RETRY_SECONDS", default=300.0)
UNASSIGNED_RETRY_MAX_SECONDS = env.float("UNASSIGNED_RETRY_MAX_SECONDS", default=3600.0)
UNASSIGNED_RETRY_BATCH_SIZE = env.int("UNASSIGNED_RETRY_BATCH_SIZE", default=100)
UNASSIGNED_ALERT_COUNT = env.int("UNASSIGNED_ALERT_COUNT", default=50)
UNASSIGNED_ALERT_AGE_SECONDS = env.int("UNASSIGNED_ALERT_AGE_SECONDS", default=3600)
# /metrics: a Bearer token, or a client address inside one of these networks (CIDR). Behind a
# reverse proxy (BEHIND_TLS_PROXY) every request comes from the proxy's address, so the networks
# are not trusted there: the token is required.
METRICS_TOKEN: str = env.str("METRICS_TOKEN", default="")
METRICS_ALLOWED_NETWORKS: list[str] = env.list(
    "METRICS_ALLOWED_NETWORKS", default=["127.0.0.1/32", "::1/128"]
)
METRICS_CACHE_SECONDS = env.float("METRICS_CACHE_SECONDS", default=5.0)
# The counters are stored totals up to a high-water mark plus the rows past it (no whole-table
# counts per scrape). The mark moves past rows at least METRICS_SETTLE_SECONDS old (every
# transaction that could still commit an older id has ended by then); check_backlog moves it,
# and a scrape does when it is older than METRICS_REFRESH_SECONDS. Leads per status (a gauge)
# are recounted every METRICS_STATUS_REFRESH_SECONDS, the waiting statuses at every scrape.
METRICS_SETTLE_SECONDS = env.float("METRICS_SETTLE_SECONDS", default=300.0)
METRICS_REFRESH_SECONDS = env.float("METRICS_REFRESH_SECONDS", default=60.0)
METRICS_STATUS_REFRESH_SECONDS = env.float("METRICS_STATUS_REFRESH_SECONDS", default=300.0)
CELERY_BEAT_SCHEDULE["monitoring-check-backlog"] = {
    "task": "maintenance.check_backlog",
    "schedule": BACKLOG_CHECK_INTERVAL_SECONDS,
    "options": {"queue": "maintenance", "expires": BACKLOG_CHECK_INTERVAL_SECONDS},
}
CELERY_BEAT_SCHEDULE["monitoring-check-refusals"] = {
    "task": "maintenance.check_refusals",
    "schedule": BACKLOG_CHECK_INTERVAL_SECONDS,
    "options": {"queue": "maintenance", "expires": BACKLOG_CHECK_INTERVAL_SECONDS},
}
CELERY_BEAT_SCHEDULE["monitoring-check-sla"] = {
    "task": "maintenance.check_sla",
    "schedule": SLA_CHECK_INTERVAL_SECONDS,
    "options": {"queue": "maintenance", "expires": SLA_CHECK_INTERVAL_SECONDS},
}
CELERY_BEAT_SCHEDULE["monitoring-warn-sla"] = {
    "task": "maintenance.warn_sla",
    "schedule": SLA_CHECK_INTERVAL_SECONDS,
    "options": {"queue": "maintenance", "expires": SLA_CHECK_INTERVAL_SECONDS},
}
# Each rep's load counters (open and today's leads, routing.loads) are compared with the
# assignments, and repaired where they drifted, every REP_LOAD_RECONCILE_SECONDS.
REP_LOAD_RECONCILE_SECONDS = env.float("REP_LOAD_RECONCILE_SECONDS", default=900.0)
CELERY_BEAT_SCHEDULE["monitoring-reconcile-rep-loads"] = {
    "task": "maintenance.reconcile_rep_loads",
    "schedule": REP_LOAD_RECONCILE_SECONDS,
    "options": {"queue": "maintenance", "expires": REP_LOAD_RECONCILE_SECONDS},
}
CELERY_BEAT_SCHEDULE["monitoring-retry-unassigned"] = {
    "task": "maintenance.retry_unassigned",
    "schedule": UNASSIGNED_RETRY_SECONDS,
    "options": {"queue": "maintenance", "expires": UNASSIGNED_RETRY_SECONDS},
}

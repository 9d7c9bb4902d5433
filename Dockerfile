# LeadRouter image: one image for every process (web, worker, beat, migrate); the command decides
# which. Build: `docker build -t leadrouter .`  Run the stack: see docker-compose.yml.
FROM python:3.11-slim

ARG UV_VERSION=0.13.9

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_PROJECT_ENVIRONMENT=/app/.venv \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1

# The runtime user: nothing runs as root. It gets a home because tools expect one.
RUN pip install "uv==${UV_VERSION}" \
    && groupadd --system --gid 10001 leadrouter \
    && useradd --system --uid 10001 --gid leadrouter --create-home --home-dir /home/leadrouter \
       --shell /usr/sbin/nologin leadrouter

WORKDIR /app

# Dependencies first, so that a code change does not reinstall them. Exactly the locked versions,
# without the dev group (tests, linters).
COPY pyproject.toml uv.lock ./
RUN uv sync --frozen --no-dev --no-install-project

# The project. .dockerignore keeps the host's .venv, var/ and .env out of the image.
COPY . .

ENV PATH="/app/.venv/bin:${PATH}" \
    DJANGO_SETTINGS_MODULE=config.settings.base \
    LEADROUTER_VAR_DIR=/app/var \
    HOST=0.0.0.0 \
    PORT=8000

# Settings create var/ (static files, and on a laptop the SQLite file and the filesystem broker)
# on import, so it must belong to the runtime user. Static files are collected at build time into
# var/static, where WhiteNoise serves them from. The SECRET_KEY here exists only for this one
# command, so that settings import without generating a key file; it is not kept in the image.
# The same for the privacy keys: a key file baked into the image would open every sealed person
# for anyone who can pull it (compose requires PRIVACY_KEYS and PRIVACY_HASH_KEY from .env).
# var/audit-heads exists in the image so that the compose volume mounted there starts out
# owned by the runtime user.
RUN mkdir -p /app/var/audit-heads && chown -R leadrouter:leadrouter /app/var
USER leadrouter
RUN SECRET_KEY=collectstatic-only-not-a-secret \
    PRIVACY_KEYS=collectstatic-only-not-a-key PRIVACY_HASH_KEY=collectstatic-only-not-a-key \
    python manage.py collectstatic --noinput -v 0 \
    && rm -rf /app/var/broker /app/var/secret-key /app/var/privacy-key /app/var/privacy-hash-key

EXPOSE 8000

CMD ["gunicorn", "config.wsgi:application", "--config", "config/gunicorn.py"]

# LeadRouter: `make run` and `make test` are all a newcomer needs (see README.md).
SHELL := /bin/bash
PYTHON ?= python3
# uv: the one on PATH, else the one `make` bootstraps into .tools/ (rule below).
UV ?= $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
# The ASGI process that serves the lead status URLs' waiting requests (Procfile `status`).
STATUS_PORT ?= $(shell echo $$(($(PORT) + 1)))
export UV_PYTHON_DOWNLOADS ?= never
export UV_PROJECT_ENVIRONMENT := $(VENV)

.PHONY: setup run test test-services reliability lint format migrate seed spike traffic bench bench-memory clean help

help:
	@echo "make run     set up and run web + worker + beat (embedded SQLite and broker by default)"
	@echo "make test    set up and run the test suite"
	@echo "make lint    ruff check, ruff format --check, mypy, import contracts"
	@echo "make reliability  the fault tests (tests/reliability) at RELIABILITY_SCALE=10 times"
	@echo "             CI's traffic (needs DATABASE_URL and REDIS_URL)"
	@echo "make spike   (with make run up) post a webinar spike of SPIKE=400 demo leads"
	@echo "make traffic (with make run up) post COUNT=200 demo leads at RATE=5 per second"
	@echo "make bench   every benchmark in bench/ (needs PostgreSQL and Redis; docs/benchmarks.md)"
	@echo "make bench-memory  RSS of web and workers after 100,000 leads (45 minutes)"

# Bootstrap uv into a virtualenv of its own. Where `python3 -m venv` does not work (Debian and
# Ubuntu without python3-venv), install it with `pip install --user` instead (the retry covers
# PEP 668's "externally managed" refusal; uv has no Python dependencies to clash) and make
# .tools/bin/uv a wrapper for `python3 -m uv`, so that $(UV) is one path either way.
.tools/bin/uv:
	@echo "uv not found: installing it into .tools/ with pip"
	@if $(PYTHON) -m venv .tools >/dev/null 2>&1; then \
	  .tools/bin/python -m pip install --quiet uv; \
	else \
	  echo "($(PYTHON) -m venv failed: installing uv with pip install --user)"; \
	  rm -rf .tools && mkdir -p .tools/bin \
	  && { $(PYTHON) -m pip install --user --quiet uv 2>/dev/null \
	       || $(PYTHON) -m pip install --user --quiet --break-system-packages uv; } \
	  && printf '#!/bin/sh\nexec %s -m uv "$$@"\n' '$(PYTHON)' >$@.tmp \
	  && chmod +x $@.tmp && mv $@.tmp $@; \
	fi
	@$@ --version

$(VENV)/.synced: pyproject.toml uv.lock $(if $(filter .tools/bin/uv,$(UV)),.tools/bin/uv)
	$(UV) sync --frozen
	@touch $@

setup: $(VENV)/.synced

migrate: setup
	$(PY) manage.py migrate --noinput

seed: migrate
	$(PY) manage.py seed_demo --base-url http://$(HOST):$(PORT)

# collectstatic takes seconds even when nothing changed, so `make run` skips it while the manifest
# in the default STATIC_ROOT (var/static) is newer than everything the collected files come from:
# the locked and installed dependencies, the settings and the project's own static/ folders. With
# STATIC_ROOT or LEADROUTER_VAR_DIR set (environment or .env) it always runs.
STATIC_MANIFEST := var/static/staticfiles.json
define static_is_stale
[ -n "$${STATIC_ROOT}$${LEADROUTER_VAR_DIR}" ] \
|| grep -qsE '^[[:space:]]*(export[[:space:]]+)?(STATIC_ROOT|LEADROUTER_VAR_DIR)=' .env \
|| [ ! -f $(STATIC_MANIFEST) ] \
|| [ -n "$$(find pyproject.toml uv.lock $(VENV)/.synced config/settings \
      $$(find . -path './.*' -prune -o -path ./var -prune -o -type d -name static -print) \
      -name __pycache__ -prune -o -newer $(STATIC_MANIFEST) -print -quit)" ]
endef

run: migrate
	@$(PY) manage.py seed_demo --if-empty --base-url http://$(HOST):$(PORT)
	@if $(static_is_stale); then $(PY) manage.py collectstatic --noinput -v 0; \
	else echo "Static files are up to date ($(STATIC_MANIFEST))."; fi
	@echo ""
	@echo "  LeadRouter is starting (web, status, worker, io worker, beat). Ctrl-C stops them all."
	@echo "    Admin:      http://$(HOST):$(PORT)/admin/"
	@if [ -f var/demo-login.txt ]; then echo "    Logins:"; sed 's/^/      /' var/demo-login.txt; \
	  echo "    Demo source tokens and an API token: var/demo.json"; fi
	@echo "    API docs:   http://$(HOST):$(PORT)/api/v1/docs/"
	@echo "    Lead status URLs (their waiting requests): http://$(HOST):$(STATUS_PORT)/api/v1/status/"
	@echo "    Readiness:  http://$(HOST):$(PORT)/readyz"
	@echo ""
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" HOST=$(HOST) PORT=$(PORT) STATUS_PORT=$(STATUS_PORT) \
	  STATUS_BASE_URL=$${STATUS_BASE_URL:-http://$(if $(filter 0.0.0.0,$(HOST)),127.0.0.1,$(HOST)):$(STATUS_PORT)} \
	  CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT=$${CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT:-3} \
	  LEADROUTER_URL=http://$(if $(filter 0.0.0.0,$(HOST)),127.0.0.1,$(HOST)):$(PORT) \
	  $(PY) -m config.stack -f Procfile

# Demo traffic for a running `make run` (see simulate_traffic --help for more).
SPIKE ?= 400
COUNT ?= 200
RATE ?= 5
spike: setup
	$(PY) manage.py simulate_traffic --url http://$(HOST):$(PORT) --spike $(SPIKE)

traffic: setup
	$(PY) manage.py simulate_traffic --url http://$(HOST):$(PORT) --count $(COUNT) --rate $(RATE)

# pytest exits 5 when it collects no tests. With a filter in PYTEST_ARGS (-k, -m, a path) that is
# no failure; a plain `make test` that collects nothing has lost the suite, and fails.
test: setup
	@$(VENV)/bin/pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ] && [ -n "$(if $(strip $(PYTEST_ARGS)),filtered)" ]; then \
	  echo "pytest: no tests matched PYTEST_ARGS"; exit 0; fi; \
	exit $$rc

# The fault tests of tests/reliability (real gunicorn, celery, redis-server and PostgreSQL processes,
# faults by PID) at the sizes of the reliability guide's test plan: RELIABILITY_SCALE (a whole
# number) times the small versions `make test` and CI run (scale 1: seconds to a minute each).
# Services are required (no silent skip), and pytest's per-test timeout grows with the scale.
RELIABILITY_SCALE ?= 10
reliability: setup
	RELIABILITY_SCALE=$(RELIABILITY_SCALE) REQUIRE_SERVICES=1 $(VENV)/bin/pytest -m reliability \
	  -p no:warnings -s --timeout $$((300 * $(RELIABILITY_SCALE))) $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: setup
	$(PY) -m bench

# Memory after 100,000 leads: the spike at the webinar's rate for ten minutes, RSS of web and
# workers before, once a minute while draining, and after (45 minutes on 2 cores).
bench-memory: setup
	$(PY) -m bench.spike --leads 100000 --seconds 600 --workers 2 --baseline-leads 10000 \
	  --drain-timeout 4000

clean:
	rm -rf $(VENV) .tools var .pytest_cache .mypy_cache .ruff_cache

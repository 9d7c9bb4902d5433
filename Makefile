# LeadRouter: `make run` and `make test` are all a newcomer needs (see README.md).
SHELL := /bin/bash
PYTHON ?= python3
UV ?= $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
export UV_PYTHON_DOWNLOADS ?= never
export UV_PROJECT_ENVIRONMENT := $(VENV)

.PHONY: setup run test test-services lint format migrate seed bench clean help

help:
	@echo "make run     set up and run web + worker + beat (embedded SQLite and broker by default)"
	@echo "make test    set up and run the test suite"
	@echo "make lint    ruff check, ruff format --check, mypy, import contracts"

.tools/bin/uv:
	@echo "uv not found: installing it into .tools/ with pip"
	$(PYTHON) -m venv .tools
	.tools/bin/python -m pip install --quiet uv

$(VENV)/.synced: pyproject.toml uv.lock $(if $(filter .tools/bin/uv,$(UV)),.tools/bin/uv)
	$(UV) sync --frozen
	@touch $@

setup: $(VENV)/.synced

migrate: setup
	$(PY) manage.py migrate --noinput

seed: migrate
	$(PY) manage.py seed_demo

run: migrate
	@$(PY) manage.py seed_demo --if-empty
	@$(PY) manage.py collectstatic --noinput -v 0
	@echo ""
	@echo "  LeadRouter is starting (web, worker, beat). Ctrl-C stops all three."
	@echo "    Admin:      http://$(HOST):$(PORT)/admin/   (login: $$(cat var/demo-login.txt 2>/dev/null))"
	@echo "    API docs:   http://$(HOST):$(PORT)/api/v1/docs/"
	@echo "    Readiness:  http://$(HOST):$(PORT)/readyz"
	@echo ""
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" HOST=$(HOST) PORT=$(PORT) $(VENV)/bin/honcho start -f Procfile

# pytest exits 5 when it collects no tests (e.g. a -k filter): not a failure.
test: setup
	@$(VENV)/bin/pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc

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

clean:
	rm -rf $(VENV) .tools var .pytest_cache .mypy_cache .ruff_cache

# The two commands a newcomer needs: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint format services browser install bytecode clean

## install: a virtual environment with the CPU build of torch 2.13.0 first, then the project
install: $(STAMP)
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

## bytecode: compile the project's modules ahead: a job's sandbox reads them read-only as another
## user, so it never caches its own, and PYTHONDONTWRITEBYTECODE=1 keeps every process from doing it
bytecode: install
	@$(BIN)/python -m compileall -q -j 0 sdk workers server > /dev/null

## services: make sure PostgreSQL and Redis answer (starting them when installed but stopped)
services:
	@bash scripts/ensure-services.sh

## browser: Debian's chromium for the dashboard's browser tests (installed when missing and root)
browser:
	@bash scripts/ensure-browser.sh

## demo: from nothing to a digits classifier trained through the SDK with 2 processes
demo: install bytecode
	@bash scripts/demo.sh

## test: lint, the import rules and the type checker, then every test (unit, integration, end-to-end) against real Postgres, Redis, Celery, torchrun
test: install bytecode services browser
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/pytest -q --durations=25

## test-fast: only the tests not marked slow
test-fast: install bytecode
	$(BIN)/pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .ace3 .pytest_cache .ruff_cache .mypy_cache

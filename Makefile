# `make test` is the whole check on a fresh Debian machine: a venv with every extra,
# the real servers from apt where missing, then ruff, mypy --strict and pytest.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test lint typecheck pytest servers bench clean

test: lint typecheck pytest

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,all]'
	touch $@

servers:
	bash scripts/install-servers.sh

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed
	$(BIN)/mypy

pytest: $(VENV)/.installed servers
	$(BIN)/pytest

bench: $(VENV)/.installed servers
	$(BIN)/python -m benchmarks.redis
	$(BIN)/python -m benchmarks.zookeeper
	$(BIN)/python -m benchmarks.database
	$(BIN)/python -m benchmarks.chain

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

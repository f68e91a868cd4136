# `make test` is the whole check on a fresh Debian machine: a venv with every extra,
# the real servers from apt where missing, then ruff, mypy --strict, the docs site and
# pytest. `make demo` sets up the same venv and runs the oversell demo on the embedded
# default (no server needed).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test lint typecheck docs pytest servers bench bench-check demo soak clean

test: lint typecheck docs pytest

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

docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir .site

demo: $(VENV)/.installed
	$(BIN)/locks demo

pytest: $(VENV)/.installed servers
	$(BIN)/pytest

# long fault campaigns with fresh seeds: `make soak MINUTES=30`, or replay one with SEED=...
SEED ?=
MINUTES ?= 10
CAMPAIGN ?=
soak: $(VENV)/.installed servers
	$(BIN)/python -m tests.campaign --minutes $(MINUTES) $(if $(SEED),--seed $(SEED)) \
		$(foreach c,$(CAMPAIGN),--campaign $(c)) --out $(or $(OUT),.soak)

bench: $(VENV)/.installed servers
	$(BIN)/python -m benchmarks.redis
	$(BIN)/python -m benchmarks.zookeeper
	$(BIN)/python -m benchmarks.database
	$(BIN)/python -m benchmarks.postgresql
	$(BIN)/python -m benchmarks.chain
	$(BIN)/python -m benchmarks.failover

# short reruns of the quick benchmarks, their ratios against benchmarks/floors.toml; not
# part of `test`: a ratio is not a pass/fail figure on a shared machine
bench-check: $(VENV)/.installed servers
	$(BIN)/python -m benchmarks.check --quick

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .site .soak

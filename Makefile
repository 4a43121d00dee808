# The two commands a new user types: `make quickstart` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SEEDS ?= 2000

.PHONY: quickstart test lint sim soak bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

quickstart: $(STAMP)
	$(BIN)/herder quickstart

test: $(STAMP)
	.ci/chromium
	$(BIN)/python -m pytest -m "not slow" -q

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

sim: $(STAMP)
	HERDER_SIM_SEEDS=$(SEEDS) $(BIN)/python -m pytest -m sim -q

soak: $(STAMP)
	$(BIN)/python -m pytest -m slow -q

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache

# The two commands a new user types: `make quickstart` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SEEDS ?= 2000
# seeds of the real-host simulator (tests/sim/real): each runs whole servers, so fewer
REAL_SEEDS ?= 1000

.PHONY: quickstart test lint sim soak bench clean postgresql nftables

# root installs packages itself; anyone else through sudo
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

quickstart: $(STAMP)
	$(BIN)/herder quickstart

# the JDBC tests start throwaway servers from Debian's postgresql package
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || \
		{ $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		  $(SUDO) apt-get install -y -q --no-install-recommends postgresql; }

# the nemesis soak cuts and thins links between network namespaces with nftables
nftables:
	@command -v nft >/dev/null || [ "$$(id -u)" != 0 ] || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		  apt-get install -y -q --no-install-recommends nftables; }

test: $(STAMP) postgresql nftables
	.ci/chromium
	$(BIN)/python -m pytest -m "not slow" -q

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

sim: $(STAMP)
	HERDER_SIM_SEEDS=$(SEEDS) HERDER_SIM_REAL_SEEDS=$(REAL_SEEDS) $(BIN)/python -m pytest -m sim -q

soak: $(STAMP) postgresql nftables
	$(BIN)/python -m pytest -m slow -q

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache

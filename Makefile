# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-test services clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Exact versions with hashes from requirements/*.lock (the Dockerfile installs the same runtime
# lock), then the project itself with no dependency resolution of its own.
install: $(BIN)/python
	$(BIN)/pip install -q -r requirements/runtime.lock
	$(BIN)/pip install -q --no-deps -e .

install-test: $(BIN)/python
	$(BIN)/pip install -q -r requirements/test.lock
	$(BIN)/pip install -q --no-deps -e .

# Regenerate both locks after changing dependencies in pyproject.toml (uv resolves for every platform).
.PHONY: lock
lock: $(BIN)/python
	$(BIN)/pip install -q uv
	$(BIN)/uv pip compile pyproject.toml --python-version 3.11 --universal --generate-hashes -o requirements/runtime.lock
	$(BIN)/uv pip compile pyproject.toml --extra test --python-version 3.11 --universal --generate-hashes -o requirements/test.lock

services: install-test
	$(BIN)/python -m tests.services_check

# The system tools the suite runs (the browser tests' Chromium, the network faults' iptables and faketime):
# installed with apt-get when missing and the machine allows it (root, apt-get); otherwise
# tests/system_tools.py says how, and the tests that need them say the same.
.PHONY: browser
browser: install-test
	$(BIN)/python -m tests.system_tools

# The real-traffic Responses API fixtures, when they sit beside the checkout (they are not part of
# it); an APTIX_FIXTURES_DIR from the environment wins. Without them those tests say they did not run.
APTIX_FIXTURES_DIR ?= $(abspath $(wildcard ../shared/fixtures/responses_api))
export APTIX_FIXTURES_DIR

test: install-test services browser
	$(BIN)/python -m pytest -q

demo: install
	$(BIN)/aptix demo

# The fault matrix against real processes (see tests/chaos); e.g. `make chaos CHAOS_ARGS=--small`.
.PHONY: chaos
chaos: install-test services
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

# The network faults: the gateway and each worker on a host of its own (network namespaces, links cut,
# slowed, made lossy; a clock ahead). Root only: elsewhere it says why and exits non-zero.
.PHONY: chaos-net
chaos-net: install-test services browser
	$(BIN)/python -m tests.chaos --net $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

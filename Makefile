# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-test services clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'

services: install-test
	$(BIN)/python -m tests.services_check

test: install-test services
	$(BIN)/python -m pytest -q

demo: install
	$(BIN)/aptix demo

# The fault matrix against real processes (see tests/chaos); e.g. `make chaos CHAOS_ARGS=--small`.
.PHONY: chaos
chaos: install-test services
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

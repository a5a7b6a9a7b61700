VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/default.yaml
PYTEST_ARGS ?=

.PHONY: setup run test bench clean

setup:
	@VENV=$(VENV) scripts/setup.sh

run: setup
	$(VENV)/bin/pycollector --config $(CONFIG)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache

VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/default.yaml
PYTEST_ARGS ?=
# make fuzz: seconds per target, and which targets (all when empty); see tests/fuzz/.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?=

.PHONY: setup run test bench fuzz clean

setup:
	@VENV=$(VENV) scripts/setup.sh

run: setup
	$(VENV)/bin/pycollector --config $(CONFIG)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(PY) -m bench

fuzz: setup
	$(PY) -m tests.fuzz --seconds $(FUZZ_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf $(VENV) .pytest_cache

VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/default.yaml
PYTEST_ARGS ?=
# make fuzz: seconds per target, and which targets (all when empty); see tests/fuzz/.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?=

.PHONY: setup run test bench fuzz native clean

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

# The native heap sampler, sdk/native/build/libpycollector_heap.so (sdk/native/README.md). Needs
# gcc and sys/sdt.h only (scripts/setup.sh installs them), not the venv.
native:
	$(MAKE) -C sdk/native

clean:
	rm -rf $(VENV) .pytest_cache

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

# Two runs: the tests that need no BPF, and the BPF tests whose checks a loaded host does not move
# (load_tolerant: what is reported, not how much CPU a process got), on three workers (each file's
# tests on one; a third, on two cores, runs while the others wait on subprocesses and reports:
# 526 s against 578 s with two, the cores 94% busy); then the other BPF tests one at a time, alone (they measure shares of CPU time,
# sample counts and waits against what the workloads measure), with them the tests marked alone
# (no BPF, but they would disturb tests running beside them).
# Both run whatever the first gave; exit 5 is "no test selected" (PYTEST_ARGS naming one kind).
# Bytecode is written whatever the environment says (PYTHONDONTWRITEBYTECODE=1 on these machines):
# each pytest process, and each agent, helper and CLI the tests start, would otherwise compile every
# module of ours again, and pytest rewrite every test module's asserts (20 s a collection, 8 with it).
test: setup
	@status=0; \
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -m "(not bpf or load_tolerant) and not alone" -n 3 --dist loadfile $(PYTEST_ARGS) || [ $$? -eq 5 ] || status=1; \
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -m "bpf and not load_tolerant or alone" $(PYTEST_ARGS) || [ $$? -eq 5 ] || status=1; \
	exit $$status

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

# Two commands a new machine needs (Debian, Python 3.11, gcc):
#   make run    the main job: a local cluster (name server + broker) on loopback, embedded default config
#   make test   every test, plus the quick performance gates
# Both create .venv and install the project (building the C core) on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test perf clean

$(STAMP): pyproject.toml setup.py csrc/mqstore.c csrc/mqstore.h csrc/build_ffi.py
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3 -m venv failed: installing python3-venv"; \
	  apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -e '.[test]'
	@touch $@

run: $(STAMP)
	$(BIN)/python -m mq.cli.local

test: $(STAMP)
	$(BIN)/pytest -q tests
	$(BIN)/pytest -q perf -m quick -p no:cacheprovider

perf: $(STAMP)
	$(BIN)/pytest -q -s perf

clean:
	rm -rf $(VENV) build *.egg-info mq/_mqstore*.so mq/_mqstore.c .pytest_cache .benchmarks

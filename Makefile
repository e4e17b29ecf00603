# Two commands a new machine needs (Debian, Python 3.11, gcc):
#   make run    the main job: a local cluster (name server + broker) on loopback, embedded default config
#   make test   every test, plus the quick performance gates
# Both create .venv and install the project (building the C core) on first use: `make run` only
# what the broker needs (~50 MB), `make test` also the test and perf extras (pytest, pyspark,
# the official C++ client...: ~600 MB) and a JRE (for PySpark, used by the trace miner) when java
# is missing.
# More:
#   make perf     every performance gate (pytest-benchmark; ratios measured in one run)
#   make test-serial    the same tests one after the other (one pytest process: ~16 min here)
#   make peers    our broker side by side with Redis Streams and NATS JetStream (installs them if missing)
#   make report   a load run with tracing on, mined with Spark into perf/reports/latest/
#   make asan     the tests against the C core built with ASan and UBSan (tests/sanitized.py;
#                 ~17 min): a sanitizer report from the core fails it
#   make chaos    the fault matrix (every mode x every nemesis, ~15 min; needs root for the tmpfs of
#                 the disk-full cells) into perf/reports/chaos.md; a broken promise fails it
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# One stamp per install, each newer than what it installed from: BASE is `pip install -e .`,
# EXTRAS is `pip install -e '.[test]'` (which also counts as BASE: it touches both).  A venv made
# by `make run` gets the extras at the first `make test`; a change to a source below redoes each
# on its next use.
BASE   := $(VENV)/.installed-base
EXTRAS := $(VENV)/.installed-test
# the official RocketMQ 5.x Python client, for the gateway tests (tests/gateway): a venv of its own,
# as its import name `rocketmq` is also the official 4.x C++ client's, which .venv holds
CLIENT5 := .venv-client5/.installed
CLIENT5_VERSION := 5.1.2
# every file the build reads, the whole C core included (one .c and .h per subsystem)
SOURCES := pyproject.toml setup.py MANIFEST.in $(wildcard csrc/*.c csrc/*.h csrc/*.py)

.PHONY: test-serial run test perf peers report chaos asan java clean

$(BIN)/python:
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3 -m venv failed: installing python3-venv"; \
	  apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install -q --upgrade pip setuptools wheel

$(BASE): $(SOURCES) | $(BIN)/python
	$(BIN)/pip install -q -e .
	@touch $@

$(EXTRAS): $(SOURCES) | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	@touch $(BASE) $@

run: $(BASE)
	$(BIN)/python -m mq.cli.local

# PySpark needs a Java runtime; Debian's headless JRE when none is on PATH
java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "java not found: installing default-jre-headless (for PySpark)"; \
	  apt-get update -qq && apt-get install -y -qq default-jre-headless; }

# three pytest-xdist workers (our scheduler in tests/conftest.py: a test file is one unit, the
# timing tiers two units, each on a worker of its own), their temporary directories in RAM when
# /dev/shm has TEST_SHM_MIN_KIB free (the run peaks at ~5 GB there); otherwise two workers on
# the disk (the writeback of three workers' brokers held the machine still for seconds).  Then
# the tests that watch host-wide /dev/shm alone, then the quick perf gates alone (they measure:
# nothing may run beside them; on the disk, as users' brokers are).  README "tests in tiers".
TEST_SHM_MIN_KIB := 8388608
TEST_WORKERS = $(if $(TEST_TMPDIR),3,2)
TEST_TMPDIR := $(shell [ -w /dev/shm ] && [ "$$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)" -ge $(TEST_SHM_MIN_KIB) ] 2>/dev/null && echo /dev/shm/tmp-mqtests)
$(CLIENT5):
	@$(PYTHON) -m venv .venv-client5
	.venv-client5/bin/pip install -q rocketmq-python-client==$(CLIENT5_VERSION)
	@touch $@

test: $(EXTRAS) $(CLIENT5) java
	$(if $(TEST_TMPDIR),mkdir -p $(TEST_TMPDIR) && TMPDIR=$(TEST_TMPDIR)) \
	  $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadscope --durations=20 -m "not host_exclusive" tests
	$(BIN)/pytest -q -m host_exclusive -p no:cacheprovider tests
	$(BIN)/pytest -q perf -m quick -p no:cacheprovider

test-serial: $(EXTRAS) $(CLIENT5) java
	$(BIN)/pytest -q --durations=20 tests
	$(BIN)/pytest -q perf -m quick -p no:cacheprovider

perf: $(EXTRAS) java
	$(BIN)/pytest -q -s perf

peers: $(EXTRAS)
	$(BIN)/mqpeers

chaos: $(BASE)
	$(BIN)/mqchaos matrix --seconds 10 --out perf/reports/chaos.md

asan: $(EXTRAS) $(CLIENT5)
	$(BIN)/python tests/sanitized.py

report: $(EXTRAS) java
	$(BIN)/python -m perf.report perf/reports/latest

clean:
	rm -rf $(VENV) .venv-client5 build *.egg-info mq/_mqstore*.so mq/_mqstore.c .pytest_cache .benchmarks

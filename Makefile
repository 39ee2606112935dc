# Two entry points: `make demo` runs a workflow on a LocalCluster with Crux attached and
# prints its workflow critical path; `make test` runs the test suite.  Both create .venv.
# `make compat` runs distributed's own test modules without and with Crux preloaded;
# `make overhead` compares the CPU cost of Crux with Dask's task stream.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A checkout of distributed's test suite for the installed version (see benchmarks/compat.py):
# `make compat DISTRIBUTED_TESTS=DIR`.
DISTRIBUTED_TESTS ?=

.PHONY: demo test lint bench compat overhead clean

$(BIN)/activate: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(BIN)/activate

demo: $(BIN)/activate
	$(BIN)/crux-dask demo

test: $(BIN)/activate $(VENV)/.distributed-tests
	$(BIN)/python -m pytest

# The files of distributed's own tests that tests/test_compat.py runs, put into the
# installed package unless a copy of the suite is there already.
$(VENV)/.distributed-tests: $(BIN)/activate
	if ! $(BIN)/python -c "import importlib.util as u, sys; \
		sys.exit(u.find_spec('distributed.tests.test_worker') is None)"; then \
		bash third_party/distributed-tests/install $(BIN)/python; fi
	touch $@

lint: $(BIN)/activate
	$(BIN)/ruff check .

bench: $(BIN)/activate
	$(BIN)/python benchmarks/core_scale.py

compat: $(BIN)/activate
	$(BIN)/python benchmarks/compat.py --tests-from $(DISTRIBUTED_TESTS)

overhead: $(BIN)/activate
	$(BIN)/python benchmarks/overhead.py --together --repeats 6 --tiny 3000 --array 3000 \
		--partitions 20 --rows 100000

clean:
	rm -rf .venv .venv-* build *.egg-info

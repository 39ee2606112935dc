# Two entry points: `make demo` runs a workflow on a LocalCluster with Crux attached and
# prints its workflow critical path; `make test` runs the test suite.  Both create .venv.
# `make compat` runs distributed's own test modules without and with Crux preloaded;
# `make overhead` compares the CPU cost of Crux with Dask's task stream.
PYTHON ?= python3
VENV := .venv
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

test: $(BIN)/activate
	$(BIN)/python -m pytest

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
	rm -rf $(VENV) build *.egg-info

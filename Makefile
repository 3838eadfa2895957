# Two commands: `make demo` and `make test`. Both create .venv and install into it first.
# `make test` runs the suite on two worker processes (pytest-xdist), a file per worker at a time.
# `make fuzz SEED=3 PLANS=12` runs the long differential test (every model, more random plans).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

SEED ?= 0
PLANS ?= 8
SHARED ?= $(abspath ../shared)

.PHONY: install demo test fuzz bench

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m autoshard.solver.precompile
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m autoshard.solve examples/mlp.py --mesh 8 --out plan.json

test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile --durations=15

fuzz: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m tests.differential.fuzz --seed $(SEED) --plans $(PLANS)

bench: $(STAMP)
	AUTOSHARD_SHARED=$(SHARED) $(PY) benchmarks/iopddl.py $(SHARED)/iopddl/asplos-2025-iopddl-*.json.gz

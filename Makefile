# Two commands: `make demo` and `make test`. Both create .venv and install into it first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m autoshard.solve examples/mlp.py --mesh 8 --out plan.json

test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q

SHARED ?= $(abspath ../shared)

bench: $(STAMP)
	AUTOSHARD_SHARED=$(SHARED) $(PY) benchmarks/iopddl.py $(SHARED)/iopddl/asplos-2025-iopddl-*.json.gz

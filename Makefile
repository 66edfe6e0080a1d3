# Two entry points for a fresh machine: `make run` (default experiment) and `make test`.
# torch is installed first and pinned, so that the CPU build shipped with these machines is used;
# users with a GPU install the CUDA build of torch themselves before `make setup`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0

.PHONY: setup run lint test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed

# The main job: the default experiment, cut to 3 rounds so that it ends in a few minutes (plain
# `dpsbi-run` fits the library's full defaults: SPPE 10 x 1000 simulations).
run: setup
	$(VENV)/bin/dpsbi-run budget.rounds=3

# Lint and format checks first (ruff, configured in pyproject.toml), then the suite.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# One pytest worker per core (pytest-xdist): two on CI's two cores, about half the time of one.
test: lint
	$(PY) -m pytest -q -n auto

clean:
	rm -rf $(VENV) outputs multirun

# Two entry points for a fresh machine: `make run` (default experiment) and `make test`.
# torch is installed first and pinned, so that the CPU build shipped with these machines is used;
# users with a GPU install the CUDA build of torch themselves before `make setup`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0

.PHONY: setup run test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/dpsbi-run

test: setup
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) outputs multirun

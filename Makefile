# Two commands for a newcomer: `make demo` and `make test`.  Each sets up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mploader-installed

.PHONY: setup demo test lint bench clean

# torch==2.13.0 is installed first and only when missing: a looser requirement on a machine
# without torch pulls several GB of CUDA packages.  pyproject's range is satisfied by it, so the
# package install never upgrades torch.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	PYTHONPATH=$(CURDIR) $(PY) examples/demo.py  # nebula_testing/ lives in the repository, not the wheel

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

test: lint
	$(PY) -m pytest -q

bench: setup
	$(PY) benchmarks/versus.py
	$(PY) benchmarks/threads.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

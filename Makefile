# Two commands for a newcomer: `make demo` and `make test`.  Each sets up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mploader-installed

.PHONY: setup demo test lint bench compat docs clean

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

# Three test processes on two cores (pytest-xdist; worksteal evens out the long fault-table
# and finalizer tests): the suite's processes mostly wait on the processes they start, so three
# keep both cores busy.  16.5 min serially, 8.6 min so (2026-11-28, docs/internals/testing.md).
test: lint
	$(PY) -m pytest -q -n 3 --dist worksteal

# The suites that depend most on torch's version (parity with torch, worker lifecycle, resume,
# shared memory, the layer rules), on another torch in its own virtual environment:
# `make compat TORCH=2.6.0`.  Other versions come from PyPI as CUDA builds (about 4 GB; they run
# on the CPU); .ci/run runs this for the ends of the supported ranges (torch 2.6.0 on Python
# 3.11, 2.13.0 on 3.12, 2.14.1 on 3.13).  Serially, as docs/internals/testing.md measured them.
# In three test processes (8.3 min of pytest for torch 2.14.1 against 13.8) test_fork_warning
# failed on Python 3.12 under their load; issue 40 found such a failure's cause on 3.13 (a
# reaper thread of mploader's, still ending at a fork, taken for another's), fixed it, and the
# test now runs beside busy processes itself.
# `make compat TORCH=2.14.1 PYTHON=/path/to/python3.13` runs them on another Python (a venv per
# torch and Python).
TORCH ?= 2.6.0
COMPAT_PYTHON_VERSION = $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
COMPAT_VENV = .venv-torch-$(TORCH)-py$(COMPAT_PYTHON_VERSION)
COMPAT_PY = $(COMPAT_VENV)/bin/python
COMPAT_TESTS := tests/parity tests/lifecycle tests/resume tests/shm tests/test_layers.py

compat:
	test -x $(COMPAT_PY) || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$(TORCH)')" \
		2>/dev/null || $(COMPAT_PY) -m pip install --quiet torch==$(TORCH)
	$(COMPAT_PY) -m pip install --quiet -e '.[test]'
	$(COMPAT_PY) -c "import sys, torch; print('torch', torch.__version__, 'python', sys.version.split()[0])"
	$(COMPAT_PY) -m pytest -q $(COMPAT_TESTS)

# The manual: docs/_build/html/index.html.  Warnings are errors (-W) and every cross-reference
# must resolve (-n), so a broken reference or an undocumented public name fails the build.
DOCS_STAMP := $(VENV)/.mploader-docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	rm -rf docs/_build docs/reference/generated
	$(PY) -m sphinx -W --keep-going -n -q -b html docs docs/_build/html
	@echo "the manual: docs/_build/html/index.html"

bench: setup
	$(PY) benchmarks/versus.py
	$(PY) benchmarks/threads.py

clean:
	rm -rf $(VENV) .venv-torch-* .pytest_cache .mypy_cache .ruff_cache docs/_build docs/reference/generated

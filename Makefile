# `make demo` and `make test` work from a fresh clone: each creates .venv if it is missing and installs
# rxcuda into it (editable, with the dev tools) whenever pyproject.toml (or this file) is newer than the
# last install. The install is editable: edits and new modules need no reinstall.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

# Every module's docstring examples run with the tests (examples that need a device are marked
# `# doctest: +SKIP` where they stand).

.PHONY: demo test install

demo: $(STAMP)
	$(VENV)/bin/rxcuda demo

# ruff, mypy (rxcuda/engine and rxcuda/streams, configured in pyproject.toml), then pytest with the docstring
# examples. Every step runs even when an earlier one fails, so one run reports everything; pytest's summary
# line comes last (.ci/run looks for it) and the exit status is non-zero when any step failed.
test: $(STAMP)
	@status=0; \
	echo "== ruff"; $(VENV)/bin/ruff check $(wildcard rxcuda tests bench examples) || status=1; \
	echo "== mypy"; $(VENV)/bin/mypy || status=1; \
	echo "== pytest"; $(VENV)/bin/python -m pytest -q tests --doctest-modules rxcuda || status=1; \
	exit $$status

install: $(STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml Makefile | $(VENV)/bin/python
	@echo "installing rxcuda into $(VENV) (pip install -e '.[dev]'; log in $(VENV)/install.log)"
	@$(VENV)/bin/python -m pip install -q -e '.[dev]' > $(VENV)/install.log 2>&1 \
		|| { cat $(VENV)/install.log; echo "pip install failed; see above"; exit 1; }
	@touch $@

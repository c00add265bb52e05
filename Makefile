# `make demo` and `make test` work from a fresh clone: each creates .venv if it is missing and installs
# rxcuda into it (editable, with the dev tools) whenever pyproject.toml (or this file) is newer than the
# last install. The install is editable: edits and new modules need no reinstall.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test install

demo: $(STAMP)
	$(VENV)/bin/rxcuda demo

test: $(STAMP)
	$(VENV)/bin/ruff check $(wildcard rxcuda tests bench examples)
	$(VENV)/bin/python -m pytest -q tests

install: $(STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml Makefile | $(VENV)/bin/python
	@echo "installing rxcuda into $(VENV) (pip install -e '.[dev]'; log in $(VENV)/install.log)"
	@$(VENV)/bin/python -m pip install -q -e '.[dev]' > $(VENV)/install.log 2>&1 \
		|| { cat $(VENV)/install.log; echo "pip install failed; see above"; exit 1; }
	@touch $@

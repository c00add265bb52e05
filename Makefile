# `make demo` and `make test` work from a fresh clone: each creates .venv if it is missing and installs
# rxcuda into it (editable) whenever one of INSTALL_INPUTS is newer than the last install: pyproject.toml,
# setup.py, the compiled parameter path's C source (the editable install builds it in place, and
# rxcuda/cuda/_native.py refuses a module built from another source) or this file. `make demo` installs only what
# the demo runs (rxcuda's own requirements: pip install -e .); `make test` installs the dev extra (the docs, view,
# notebook, media, ray and gl extras and the test tools, well over a GB). The install is editable: edits and new
# Python modules need no reinstall.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
CORE_STAMP := $(VENV)/.installed-core
INSTALL_INPUTS := pyproject.toml setup.py rxcuda/cuda/_hotpath.c Makefile

# Every module's docstring examples run with the tests (examples that need a device are marked
# `# doctest: +SKIP` where they stand).

.PHONY: demo test docs install chromium egl screenshot

demo: $(CORE_STAMP)
	$(VENV)/bin/rxcuda demo

# ruff, mypy (rxcuda/engine, blocks, plan, streams and distributed, configured in pyproject.toml), the documentation site, the
# wheel (tools/check_wheel.sh: built, installed into a fresh environment, run from another directory), then pytest
# with the docstring examples. Every step runs even when an earlier one fails, so one run reports everything;
# pytest's summary line comes last (.ci/run looks for it) and the exit status is non-zero when any step failed.
test: $(STAMP) chromium egl
	@status=0; \
	echo "== ruff"; $(VENV)/bin/ruff check $(wildcard rxcuda tests bench examples kernels tools) || status=1; \
	echo "== mypy"; $(VENV)/bin/mypy || status=1; \
	echo "== docs"; $(MAKE) --no-print-directory docs || status=1; \
	echo "== wheel"; sh tools/check_wheel.sh $(VENV)/bin/python || status=1; \
	echo "== pytest"; $(VENV)/bin/python -m pytest -q tests --doctest-modules rxcuda || status=1; \
	exit $$status

install: $(STAMP)

# The documentation site (mkdocs.yml, docs/) into site/, warnings as errors (--strict); needs no internet and
# no GPU. Open site/index.html in a browser (it navigates and searches from disk); `$(VENV)/bin/mkdocs serve`
# serves it while you edit. Not --quiet: that silences the warnings, and --strict then has none to count; the
# output is shown only when the build fails.
docs: $(STAMP)
	@out=$$(NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site 2>&1) \
		|| { printf '%s\n' "$$out"; exit 1; }

# tests/browser run the live view in headless Chromium: Debian's chromium package, driven by Playwright (from
# the dev extra) with that executable, so no browser is downloaded. When it is missing and this runs as root
# with apt-get (CI), tools/install_chromium.sh installs it: only what chromium depends on, never an upgrade of
# an installed package, and it prints the packages. RXCUDA_CHROMIUM=skip (or the path of another Chromium)
# skips this step; elsewhere the browser tests skip and say why.
chromium: $(STAMP)
	@if [ -z "$${RXCUDA_CHROMIUM:-}" ] && [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] \
			&& command -v apt-get > /dev/null; then \
		sh tools/install_chromium.sh $(VENV)/chromium.log; \
	fi

# The OpenGL tests (the CPU device's engine.gl_buffer, tests/unit/test_gl_cpu.py and examples/particles_gl.py) draw
# headless through EGL: without a GPU that is Mesa's EGL and its software renderer, llvmpipe. When Mesa's EGL vendor
# file or its DRI drivers are missing and this runs as root with apt-get (CI), tools/install_egl.sh installs the
# missing ones of libegl1, libegl-mesa0, libgl1 and libgl1-mesa-dri, as the chromium step does (no upgrades; it
# prints the packages). RXCUDA_EGL=skip skips this step; elsewhere those tests skip and say why.
egl: $(STAMP)
	@if [ -z "$${RXCUDA_EGL:-}" ] && [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null \
			&& { [ ! -e /usr/share/glvnd/egl_vendor.d/50_mesa.json ] || ! ls /usr/lib/*/dri/swrast_dri.so \
				> /dev/null 2>&1; }; then \
		sh tools/install_egl.sh $(VENV)/egl.log; \
	fi

# the README's picture of the live view, docs/live-view.png (1400x900) and docs/live-view-800.png (800x600),
# taken by the browser tests
screenshot: $(STAMP) chromium
	RXCUDA_SCREENSHOT=docs/live-view.png $(VENV)/bin/python -m pytest -q tests/browser/test_live_view.py -k screenshot

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# the demo's environment: rxcuda and its own requirements (the dev install below holds them too)
$(CORE_STAMP): $(INSTALL_INPUTS) | $(VENV)/bin/python
	@echo "installing rxcuda into $(VENV) (pip install -e .; log in $(VENV)/install.log)"
	@$(VENV)/bin/python -m pip install -q -e . > $(VENV)/install.log 2>&1 \
		|| { cat $(VENV)/install.log; echo "pip install failed; see above"; exit 1; }
	@touch $@

$(STAMP): $(INSTALL_INPUTS) | $(VENV)/bin/python
	@echo "installing rxcuda into $(VENV) (pip install -e '.[dev]'; log in $(VENV)/install.log)"
	@$(VENV)/bin/python -m pip install -q -e '.[dev]' > $(VENV)/install.log 2>&1 \
		|| { cat $(VENV)/install.log; echo "pip install failed; see above"; exit 1; }
	@touch $@ $(CORE_STAMP)

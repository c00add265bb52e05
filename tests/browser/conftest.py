"""The live view in a real browser: headless Chromium (Debian's ``chromium`` package, which ``make test``
installs with apt when it runs as root) driven by Playwright with that executable, so Playwright never
downloads a browser. Without Playwright or Chromium every test here is skipped, with the reason.

``RXCUDA_CHROMIUM`` names another Chromium executable (``skip``: none, and `make test` installs none);
``RXCUDA_SCREENSHOT`` names a path the screenshot of the
page is also written to (``make screenshot`` writes docs/live-view.png, the README's picture).
"""

from __future__ import annotations

import os
import shutil

import pytest


def find_chromium() -> str | None:
    """The Chromium executable: $RXCUDA_CHROMIUM, else Debian's /usr/bin/chromium, else one on PATH."""
    named = os.environ.get("RXCUDA_CHROMIUM")
    if named == "skip":
        return None
    if named:
        return named
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def why_no_chromium() -> str:
    """Why `make test` (the Makefile's `chromium` target) did not install Chromium here."""
    if os.environ.get("RXCUDA_CHROMIUM") == "skip":
        return "RXCUDA_CHROMIUM=skip"
    if shutil.which("apt-get") is None:
        return "there is no apt-get (not a Debian machine)"
    if os.geteuid() != 0:
        return "apt-get needs root, and the tests do not run as root"
    return "apt-get did not install chromium (see .venv/chromium.log)"


@pytest.fixture(scope="module")
def browser():
    """Chromium through Playwright, one per test module: Playwright's sync API keeps an asyncio event loop
    running on this thread while it is open, which would make every later asyncio.run() in the same pytest
    session fail (tests/unit/test_serve.py runs after these when pytest is given the whole tests folder)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install playwright; `make test` installs it)")
    exe = find_chromium()
    if exe is None:
        pytest.skip(f"Chromium is not installed and `make test` could not install it: {why_no_chromium()}; "
                    "install Debian's chromium package, or set RXCUDA_CHROMIUM to a Chromium executable")
    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
        b = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    """A fresh page; the test fails if the page's script throws anywhere."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(5000)  # the page answers in milliseconds; fail fast when it does not
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.errors = errors
    yield pg
    context.close()
    assert errors == [], f"the page's script threw: {errors}"

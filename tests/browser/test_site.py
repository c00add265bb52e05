"""The documentation site opened from disk (``site/index.html`` through ``file://``, as a user who ran ``make docs``
opens it): its links go to pages, not folder listings, and its search box finds what the pages say.

``RXCUDA_SITE_SHOTS`` names a folder the test writes pictures of the site into (1400x900: the home page, the API
reference and a search's results).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]') builds the site")
    # the build the docs tests use (tests/unit/_docs.py), loaded by path: tests/browser is not beside it
    spec = importlib.util.spec_from_file_location("_docs_for_site", ROOT / "tests" / "unit" / "_docs.py")
    docs = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (its dataclasses look it up there)
    spec.loader.exec_module(docs)
    return docs.build_site(tmp_path_factory.mktemp("site") / "site")


def _shot(page, name: str) -> None:
    folder = os.environ.get("RXCUDA_SITE_SHOTS")
    if folder:
        pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(pathlib.Path(folder) / f"{name}.png"))


def test_the_site_opened_from_disk_navigates(site, page):
    page.goto((site / "index.html").as_uri())
    _shot(page, "site-index")
    page.get_by_role("link", name="Getting started", exact=True).first.click()
    assert page.url.endswith("/getting-started.html")
    assert page.locator("h1").first.inner_text().strip() != ""
    assert "Index of" not in page.content()  # a folder listing is what a directory URL opens from disk
    page.goto((site / "api.html").as_uri() + "#rxcuda.Engine.serve")
    assert page.locator('[id="rxcuda.Engine.serve"]').is_visible()
    _shot(page, "site-api")


def test_the_site_opened_from_disk_searches(site, page):
    page.goto((site / "index.html").as_uri())
    box = page.locator("input.md-search__input")
    box.click()  # (at 1400 px the box is in the header; narrower, a button opens it)
    box.press_sequentially("reload", delay=20)  # typed: the search answers key presses (fill() sends none)
    results = page.locator(".md-search-result__item")
    results.first.wait_for(state="visible", timeout=20_000)  # the worker indexes the site first
    assert results.count() > 0
    assert "reload" in results.first.inner_text().lower()
    _shot(page, "site-search")
    with page.expect_navigation():
        results.first.locator("a").first.click()
    assert page.url.startswith("file://") and ".html" in page.url

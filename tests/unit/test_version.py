"""``rxcuda.__version__`` is the installed distribution's version, the one pyproject.toml declares."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import tomllib

import rxcuda

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_version_is_the_installed_distributions():
    assert rxcuda.__version__ == importlib.metadata.version("rxcuda")


def test_version_matches_pyproject_and_the_changelog():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert rxcuda.__version__ == declared
    assert re.search(rf"^## \[?{re.escape(declared)}\]?", (ROOT / "CHANGELOG.md").read_text(), re.M), (
        f"CHANGELOG.md has no section for {declared}")


def test_version_falls_back_without_an_installed_distribution(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert rxcuda._version() == "0+unknown"


def test_project_urls_and_license_file():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(project["urls"]) >= {"Homepage", "Documentation", "Source", "Changelog"}
    assert project["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text

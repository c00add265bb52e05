"""Every python block of the README runs as pasted, from any directory, on a GPU.

Each block runs in its own Python process started in an empty directory, as a user would paste it; a
block whose first line is ``# continues: NAME`` runs appended to the block(s) it continues. The README is
parsed by tests/unit/test_readme_static.py, which also checks the markers without a GPU. A block fails the
test when its process exits non-zero (an exception, a failed assert in the block) or leaves files behind
(in its directory or in the repository root).
"""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest
from conftest import gpu_subprocess_env

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _readme_parser():
    """tests/unit/test_readme_static.py, loaded by path (tests/ is no package)."""
    spec = importlib.util.spec_from_file_location("_readme_static", ROOT / "tests" / "unit" / "test_readme_static.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while a class is made
    spec.loader.exec_module(module)
    return module


SNIPPETS = _readme_parser().readme_snippets()


def _root_entries() -> set[str]:
    return {p.name for p in ROOT.iterdir()} - {"__pycache__", ".pytest_cache"}


def _numbered(source: str) -> str:
    return "\n".join(f"{i:4d}  {line}" for i, line in enumerate(source.split("\n"), 1))


def test_the_readme_has_blocks_that_need_a_gpu():
    assert sum(not s.no_gpu for s in SNIPPETS) >= 6


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.name)
def test_readme_snippet_runs(snippet, tmp_path):
    before = _root_entries()
    proc = subprocess.run([sys.executable, "-c", snippet.source], cwd=tmp_path, env=gpu_subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"README.md block '{snippet.name}' (line {snippet.line}) failed with exit status {proc.returncode}; "
        f"it ran:\n{_numbered(snippet.source)}\n--- stdout ---\n{proc.stdout[-4000:]}\n"
        f"--- stderr ---\n{proc.stderr[-8000:]}")
    assert _root_entries() == before, "a README block left files in the repository root"
    assert list(tmp_path.iterdir()) == [], "a README block left files in the directory it ran in"

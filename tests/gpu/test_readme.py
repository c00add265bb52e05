"""The README's complete snippets (those that start with an import) run as written, on a GPU."""

import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SNIPPETS = [s for s in re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
            if s.startswith(("import ", "from rxcuda import lang"))]


def test_the_readme_has_runnable_snippets():
    assert len(SNIPPETS) >= 4


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = compile(SNIPPETS[index], f"README.md snippet {index}", "exec")
    exec(code, {"__name__": f"readme_{index}"})  # noqa: S102 - running the documentation is the test
    assert os.getcwd() == str(ROOT)

"""Every python block of README.md and docs/**/*.md runs on a GPU, as a script and pasted into an interpreter.

Each block runs in its own Python process started in an empty directory (the kernels the blocks name ship
inside the package, so no block needs the checkout as its working directory) as a script, and each block that
needs a GPU once more fed line by line to an interactive interpreter (``code.InteractiveConsole``, as pasting it
would: tests/unit/test_docs.py pastes the blocks that run without a GPU); a block whose
first line is ``# continues: NAME`` runs appended to the block(s) of its file it continues. The pages are
parsed by tests/unit/_docs.py, which tests/unit/test_docs.py also uses to check the markers and run the blocks
that need no GPU. A block fails when its process exits non-zero (an exception, a failed assert in the block)
or leaves files behind.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import subprocess
import sys

import pytest
from conftest import gpu_subprocess_env

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _docs_parser():
    """tests/unit/_docs.py, loaded by path (tests/ is no package)."""
    spec = importlib.util.spec_from_file_location("_docs_parser", ROOT / "tests" / "unit" / "_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while a class is made
    spec.loader.exec_module(module)
    return module


DOCS = _docs_parser()
SNIPPETS = DOCS.all_snippets()

# run in the child: the block, fed to an interactive interpreter line by line (tests/unit/_docs.py's paste)
_PASTE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_docs_parser", sys.argv[1])
docs = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = docs
spec.loader.exec_module(docs)
docs.paste(open(sys.argv[2]).read(), run=True)
"""


def _numbered(source: str) -> str:
    return "\n".join(f"{i:4d}  {line}" for i, line in enumerate(source.split("\n"), 1))


def _missing(extras) -> str:
    """The first distribution of ``extras`` (pyproject.toml's) that is not installed, as "'.[extra]' (name)";
    '' when all are. The ``libs`` extra is NVIDIA's library wheels, which a system toolkit stands in for."""
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement

    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in extras:
        if extra == "libs":
            continue
        for req in optional.get(extra, ()):
            name = Requirement(req).name
            if name == "rxcuda":
                continue
            try:
                metadata.distribution(name)
            except metadata.PackageNotFoundError:
                return f"'.[{extra}]' ({name})"
    return ""


@functools.cache
def _no_gl_context() -> str:
    """Why no standalone EGL context can be made here ("" where one can), asked in a child process once: moderngl
    installed on a machine without libGL raises inside the snippet, which is the machine, not the page."""
    probe = "import moderngl; moderngl.create_context(standalone=True, backend='egl').release()"
    proc = subprocess.run([sys.executable, "-c", probe], env=gpu_subprocess_env(), capture_output=True, text=True,
                          timeout=120)
    if proc.returncode == 0:
        return ""
    return (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]


def test_the_pages_have_blocks_that_need_a_gpu():
    assert sum(not s.no_gpu for s in SNIPPETS) >= 10


# every block as a script; pasted into an interpreter, the blocks that need a GPU (tests/unit/test_docs.py pastes
# the others, which run on the null driver wherever they run)
RUNS = [(s, "script") for s in SNIPPETS] + [(s, "pasted") for s in SNIPPETS if not s.no_gpu]


@pytest.mark.parametrize(("snippet", "how"), RUNS, ids=lambda x: x if isinstance(x, str) else x.id)
def test_docs_snippet_runs(snippet, how, tmp_path):
    if "rxcuda.distributed" in snippet.source and importlib.util.find_spec("ray") is None:
        pytest.skip(f"{snippet.id} runs on Ray, which this Python lacks: pip install '.[ray]' to run it here "
                    "(tests/unit/test_docs.py runs it wherever Ray is installed, as CI's setup does)")
    missing = _missing(snippet.extras)
    if missing:
        pytest.skip(f"{snippet.id} needs {missing}, which this Python lacks (tools/check_wheel.sh runs it with the "
                    "extras it names)")
    if "gl" in snippet.extras and (why := _no_gl_context()):
        pytest.skip(f"{snippet.id} draws through OpenGL, and this machine makes no EGL context: {why} "
                    "(docs/opengl.md says what it needs; tests/gpu/test_gl_gpu.py skips the same way)")
    work = tmp_path / "work"
    work.mkdir()
    source = tmp_path / "block.py"
    source.write_text(snippet.source)
    if how == "script":
        command = [sys.executable, str(source)]
    else:
        command = [sys.executable, "-c", _PASTE, str(ROOT / "tests" / "unit" / "_docs.py"), str(source)]
    env = {**gpu_subprocess_env(), "RXCUDA_VIEW_WAIT_MAX": "0.1"}  # the live-view block serves 60 s for a reader
    proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"{snippet.file} block '{snippet.name}' (line {snippet.line}), run {how}, failed with exit status "
        f"{proc.returncode}; it ran:\n{_numbered(snippet.source)}\n--- stdout ---\n{proc.stdout[-4000:]}\n"
        f"--- stderr ---\n{proc.stderr[-8000:]}")
    assert sorted(p.name for p in work.iterdir()) == [], f"{snippet.id} left files in its working directory"

"""Folders import only downward (DESIGN.md, "Layout"): a folder may use the ones below it, never one above.

Lazy imports inside functions count too: an upward import is an upward import wherever it is written.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "rxcuda"

# each folder and what it may import from rxcuda (besides itself)
ALLOWED = {
    "model": set(),
    "cuda": {"model"},
    "streams": {"model"},  # the Rx side: no CUDA, no compiling
    "sources": {"model", "cuda"},
    "libraries": {"model", "cuda", "sources"},
    "engine": {"model", "cuda", "streams", "sources", "libraries"},
    "tensor": {"model", "cuda", "streams", "sources", "libraries", "engine"},  # lazy tensors, above the engine
    "view": {"model", "cuda", "streams", "sources", "libraries", "engine", "tensor"},  # seeing inside: the top layer
}
FACADE = {"__init__.py", "__main__.py", "_cli.py", "lang.py", "lowlevel.py"}


def _imports(path: pathlib.Path) -> list[str]:
    """Absolute rxcuda module names imported by a file (relative imports resolved)."""
    rel = path.relative_to(ROOT.parent).with_suffix("")
    package = list(rel.parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("rxcuda")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                if node.module is None:  # from .. import x: x may be a module
                    out += [f"{mod}.{a.name}" for a in node.names]
                    continue
            else:
                mod = node.module or ""
            if mod.startswith("rxcuda"):
                out.append(mod)
    return out


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


FILES = sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] in ALLOWED)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_folders_import_only_downward(path):
    own = path.relative_to(ROOT).parts[0]
    upward = [m for m in _imports(path) if (f := _folder(m)) and f != own and f not in ALLOWED[own]]
    assert upward == [], f"{path.relative_to(ROOT)} imports {upward}; {own}/ may use only {sorted(ALLOWED[own])}"


def test_nothing_but_the_facade_sits_at_the_top():
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name not in FACADE)
    assert loose == []


@pytest.mark.parametrize("module", ["plan/_plan.py"])
def test_planner_imports_nothing_from_cuda(module):
    imported = _imports(ROOT / "engine" / module)
    assert [m for m in imported if _folder(m) == "cuda" or m.startswith(("cupy", "cuda"))] == []


def _driver_imports(path: pathlib.Path) -> list[str]:
    """The CUDA Python packages (cuda.bindings, cuda.core) a file imports, lazily or not."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith(("cuda.bindings", "cuda.core"))]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("cuda"):
            mod = node.module or ""
            out += [mod] if mod.startswith(("cuda.bindings", "cuda.core")) else \
                [f"{mod}.{a.name}" for a in node.names if a.name in ("bindings", "core")]
    return out


# every driver call is a verb of rxcuda/cuda/: checked for tensor/ so far (the other folders follow)
DRIVER_FREE = [p for p in FILES if p.relative_to(ROOT).parts[0] == "tensor"]


@pytest.mark.parametrize("path", DRIVER_FREE, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_cuda_layer_imports_the_driver(path):
    assert _driver_imports(path) == [], (f"{path.relative_to(ROOT)} imports {_driver_imports(path)}; call the "
                                         "driver through a verb of rxcuda/cuda/ (add one there if it is missing)")


def test_the_driver_check_sees_both_import_forms(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import cuda.bindings.driver\nfrom cuda import core\nfrom cuda.bindings import nvrtc\nimport numpy\n")
    assert _driver_imports(f) == ["cuda.bindings.driver", "cuda.core", "cuda.bindings"]


def _circles(folder: str) -> list[list[str]]:
    """Import circles among the modules of ``folder`` (lazy imports count; the package's ``__init__`` is the
    facade: a module that is imported because it sits in the package is not an edge)."""
    base = f"rxcuda.{folder}"
    files = {f"{base}.{p.stem}": p for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py"}
    edges = {m: {i for i in _imports(p) if i in files and i != m} for m, p in files.items()}
    circles, done = [], set()

    def walk(m: str, path: list[str]) -> None:
        if m in path:
            circles.append(path[path.index(m):] + [m])
            return
        if m in done:
            return
        for n in sorted(edges[m]):
            walk(n, path + [m])
        done.add(m)

    for m in sorted(files):
        walk(m, [])
    return circles


@pytest.mark.parametrize("folder", ["tensor"])
def test_no_import_circle_inside_a_folder(folder):
    assert _circles(folder) == []


MAX_LINES = 650  # a module longer than this holds more than one job: split it by job


@pytest.mark.parametrize("folder", ["tensor"])
def test_modules_stay_small(folder):
    lines = {p.name: len(p.read_text().splitlines()) for p in sorted((ROOT / folder).glob("*.py"))}
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert long == {}, f"modules of {folder}/ over {MAX_LINES} lines: {long}"

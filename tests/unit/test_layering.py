"""Folders import only downward (DESIGN.md, "Layout"): a folder may use the ones below it, never one above.

Lazy imports inside functions count too: an upward import is an upward import wherever it is written.
"""

from __future__ import annotations

import ast
import pathlib
import re

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


# -- one CUDA layer: every driver (and NVRTC) call is a named verb under rxcuda/cuda/ -------------------------
_DRIVER_NAME = re.compile(r"^(cu[A-Z]\w*|CU[A-Za-z_]\w*|nvrtc[A-Z]\w*)$")  # cuGraphLaunch, CUevent_flags, ...


def _driver_uses(path: pathlib.Path) -> list[str]:
    """What in a file reaches the driver directly: an import of cuda.bindings, the layer's raw ``drv`` module,
    or an attribute that is a driver function, type or enum (``api.cuMemcpyHtoDAsync``, ``drv.CUevent_flags``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.startswith("cuda.bindings")]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.startswith("cuda.bindings") or (module == "cuda" and any(a.name == "bindings"
                                                                                for a in node.names)):
                found.append(f"from {module} import ...")
            elif module.endswith("_driver") and any(a.name == "drv" for a in node.names):
                found.append(f"from {module} import drv")
        elif isinstance(node, ast.Attribute) and _DRIVER_NAME.match(node.attr):
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


OUTSIDE_THE_CUDA_LAYER = sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in ("cuda", "tensor"))


@pytest.mark.parametrize("path", OUTSIDE_THE_CUDA_LAYER, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_cuda_layer_calls_the_driver(path):
    uses = _driver_uses(path)
    assert uses == [], (f"{path.relative_to(ROOT)} calls the CUDA driver directly ({'; '.join(uses)}); add a named "
                        "verb under rxcuda/cuda/ (e.g. _memory.copy_htod_async, _stream.synchronize) and call that")


def test_the_driver_check_sees_a_raw_call(tmp_path):
    raw = tmp_path / "raw.py"
    raw.write_text("from cuda.bindings import driver\nfrom ..cuda._driver import drv\n"
                   "def f(api, s):\n    api.cuStreamSynchronize(s)\n    return api.CUevent_flags\n")
    assert sorted(_driver_uses(raw)) == ["from cuda._driver import drv", "from cuda.bindings import ...",
                                         "line 4: .cuStreamSynchronize", "line 5: .CUevent_flags"]
    clean = tmp_path / "clean.py"
    clean.write_text("from ..cuda import _stream\ndef f(api, s):\n    _stream.synchronize(s, api=api)\n")
    assert _driver_uses(clean) == []

"""examples/notebook.ipynb runs from top to bottom in a Jupyter kernel (nbclient), here on the null driver: the
notebook sees no GPU and says so; tests/gpu runs the same notebook on a GPU, where it checks its numbers."""

from __future__ import annotations

import pathlib
import re

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook extra's nbformat is not installed")
nbclient = pytest.importorskip("nbclient", reason="the notebook extra's nbclient is not installed")
pytest.importorskip("ipykernel", reason="the notebook extra's ipykernel is not installed")
pytest.importorskip("ipywidgets", reason="the notebook extra's ipywidgets is not installed")

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "notebook.ipynb"


def shipped_by_name() -> bool:
    """Whether Block.from_kernel takes a shipped kernel's name (``"scalar_mul"``), as the notebook does."""
    import rxcuda

    try:
        rxcuda.Block.from_kernel("scalar_mul", size=4)
    except Exception:
        return False
    return True


def execute(tmp_path: pathlib.Path):
    """Run every cell in a fresh kernel whose working directory is ``tmp_path``; returns the notebook."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    if not shipped_by_name():  # a checkout from before kernels were addressed by name: point at the files
        for cell in nb.cells:
            cell.source = re.sub(r'from_kernel\("(\w+)"', rf'from_kernel("{ROOT}/kernels/\1.ptx"', cell.source)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return nb


def outputs(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        parts.extend(str(v) for v in out.get("data", {}).values())
    return "\n".join(parts)


def test_the_notebook_runs_on_the_null_driver(tmp_path):
    nb = execute(tmp_path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "no GPU" in outputs(code[0]) and "null driver" in outputs(code[0])
    quickstart = outputs(code[1])
    assert "rxcuda engine" in quickstart and "last frame:" in quickstart  # the engine's HTML repr
    assert "application/vnd.jupyter.widget-view+json" in str(code[2].outputs[0].data)  # the widgets
    sweep = outputs(code[3])
    assert "refused: scalar_mul.n" in sweep and "frames ran in the background" in sweep
    assert "120 frames, 1 rebuild" in outputs(code[5])
    assert "20 frames, t = 0.00 .. 0.76 s" in outputs(code[6]) or "PyAV is not installed" in outputs(code[6])
    assert "closed after" in outputs(code[-1])
    assert list(tmp_path.iterdir()) == []  # nothing left in the working directory

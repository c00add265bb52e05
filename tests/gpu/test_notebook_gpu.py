"""examples/notebook.ipynb on a GPU (nbclient): the notebook finds the device and checks every section's numbers
against NumPy (the quickstart, the live sweep, the solver's solution and residual, the video frames)."""

from __future__ import annotations

import pathlib
import sys

import pytest

pytest.importorskip("nbclient", reason="the notebook extra's nbclient is not installed")
pytest.importorskip("ipykernel", reason="the notebook extra's ipykernel is not installed")
pytest.importorskip("ipywidgets", reason="the notebook extra's ipywidgets is not installed")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "unit"))
from test_notebook_example import execute, outputs  # noqa: E402  (one way to run the notebook)


def test_the_notebook_runs_on_the_gpu_and_matches_numpy(tmp_path):
    nb = execute(tmp_path)  # a failed check in a cell raises CellExecutionError here, with the cell's traceback
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "running on a GPU" in outputs(code[0])
    assert "rxcuda engine" in outputs(code[1]) and "us host" in outputs(code[1])
    assert "120 frames, 1 rebuild; residual" in outputs(code[5]) and "-> 0 " not in outputs(code[5])

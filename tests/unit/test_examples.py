"""The examples on a machine without a GPU: one line that says what they need, and a non-zero exit."""

import os
import pathlib
import subprocess
import sys

import pytest

import rxcuda

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
# examples that run without a GPU too (on the null driver, saying so); every other one needs a device
RUN_ANYWHERE = {"distributed.py"}
HAS_GPU, WHY = rxcuda.probe()


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"quickstart.py", "sensor_params.py", "hot_reload.py"}


@pytest.mark.skipif(HAS_GPU, reason="checks what a machine without a CUDA device prints")
@pytest.mark.parametrize("example", [p for p in EXAMPLES if p.name not in RUN_ANYWHERE], ids=lambda p: p.name)
def test_an_example_without_a_gpu_says_what_it_needs_in_one_line(example, tmp_path):
    proc = subprocess.run([sys.executable, str(example), "1"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr == f"examples/{example.name} runs on a CUDA device, and this machine has none: {WHY}\n"
    assert list(tmp_path.iterdir()) == []  # nothing left in the current directory


@pytest.mark.skipif(HAS_GPU, reason="checks the null-driver run of a machine without a CUDA device")
def test_the_distributed_example_runs_on_the_null_driver_and_says_so(tmp_path):
    pytest.importorskip("ray", reason="examples/distributed.py runs on Ray: pip install 'rxcuda[ray]'")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "distributed.py"), "3"], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("no CUDA device (") and "the workers run on the null driver" in proc.stdout
    assert "links: {'gain.out -> level.x': 'host'}" in proc.stdout
    assert "3 frames on workers camera, filter; last frame's tiers {'camera': (), 'filter': ('parameters',)}" \
        in proc.stdout
    assert list(tmp_path.iterdir()) == []

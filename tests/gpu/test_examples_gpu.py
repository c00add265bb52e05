"""The examples run on a GPU from any directory, as ``python -m rxcuda.examples.NAME``, and leave nothing
behind."""

import pathlib
import re
import subprocess
import sys

from conftest import gpu_subprocess_env


def run_example(name: str, *args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    module = f"rxcuda.examples.{pathlib.Path(name).stem}"
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd,
                          env=gpu_subprocess_env(), timeout=120)


def test_rxcuda_examples_runs_one_by_name(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rxcuda", "examples", "quickstart"], capture_output=True,
                          text=True, cwd=tmp_path, env=gpu_subprocess_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("max error vs NumPy") == 3
    assert list(tmp_path.iterdir()) == []


def test_quickstart_runs(tmp_path):
    proc = run_example("quickstart.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("max error vs NumPy") == 3


def test_sensor_params_runs(tmp_path):
    proc = run_example("sensor_params.py", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "frames; last frame" in proc.stdout


def test_hot_reload_runs_and_removes_its_kernel(tmp_path):
    proc = run_example("hot_reload.py", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    path = pathlib.Path(re.search(r"edit and save (\S+forces\.cu)", proc.stdout).group(1))
    assert not path.parent.exists()  # its temporary folder is gone
    assert list(tmp_path.iterdir()) == []  # and nothing was written to the current directory


def test_solver_converges_on_the_device(tmp_path):
    proc = run_example("solver.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: every solve met tol=" in proc.stdout


def test_peaks_refines_only_when_loud(tmp_path):
    proc = run_example("peaks.py", "30", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: 30 frames, 10 refined on the GPU's decision" in proc.stdout


def test_particles_match_numpy_and_a_batch_matches_ticks(tmp_path):
    proc = run_example("particles.py", "200", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: 200 frames match NumPy" in proc.stdout and "run_batch(120) equals 120 ticks" in proc.stdout
    assert list(tmp_path.iterdir()) == []  # forces.cu lived in a temporary folder


def test_train_mlp_learns_with_one_graph_a_step(tmp_path):
    proc = run_example("train_mlp.py", "200", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: the loss went down" in proc.stdout
    assert "traced 1x, 1 CUDA graph, 200 graph launches" in proc.stdout
    accuracy = float(re.search(r"accuracy on 4096 fresh points ([\d.]+)%", proc.stdout).group(1))
    assert accuracy > 60
    assert list(tmp_path.iterdir()) == []


def test_distributed_runs_two_workers_on_one_gpu(tmp_path):
    import pytest

    pytest.importorskip("ray", reason="examples/distributed.py runs on Ray: pip install '.[ray]'")
    proc = run_example("distributed.py", "5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "links: {'gain.out -> level.x': 'ipc'}" in proc.stdout
    err = float(re.search(r"max error vs NumPy (\S+)", proc.stdout).group(1))
    assert err < 1e-5

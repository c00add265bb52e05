"""rxcuda demo on a GPU: its numbers match NumPy and its hot updates take the Parameters tier."""

import pathlib
import subprocess
import sys

from conftest import gpu_subprocess_env

ROOT = pathlib.Path(__file__).resolve().parents[2]


def demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rxcuda", "demo", *args], capture_output=True, text=True, cwd="/",
                          env=gpu_subprocess_env(), timeout=300)


def test_demo_matches_numpy_through_hot_updates():
    proc = demo("--frames", "120", "--size", "5000")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "OK"
    segments = [ln for ln in lines if ln.startswith("  frames")]
    assert [ln.split("scale")[1].split(":")[0].strip() for ln in segments] == ["3.0", "0.5", "-2.0"]
    assert all(ln.endswith("matches NumPy") for ln in segments)
    assert "2 hot updates applied through: parameters; graph builds in all: 1" in proc.stdout


def test_demo_single_frame():
    proc = demo("--frames", "1", "--size", "256")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "frames    0-0" in proc.stdout and "median n/a" in proc.stdout


def test_demo_into_a_closed_pipe_stops_quietly_on_the_gpu():
    """`rxcuda demo | head -1` while the engine runs: exit 141 (as SIGPIPE would), no traceback, no 'Broken pipe'."""
    proc = subprocess.Popen([sys.executable, "-m", "rxcuda", "demo", "--frames", "60", "--size", "4096"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", env=gpu_subprocess_env())
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=300) == 141 and err == b""

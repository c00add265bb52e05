"""The rxcuda command without a GPU: info, the planned demo pipeline, and the demo's checks (fake engine)."""

from __future__ import annotations

import argparse
import io
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest

import rxcuda
from rxcuda import _cli
from rxcuda.model._describe import PortRef

ROOT = pathlib.Path(__file__).resolve().parents[2]
HAS_GPU, _ = rxcuda.probe()
no_gpu = pytest.mark.skipif(HAS_GPU, reason="checks what a machine without a CUDA device prints")


def run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    old, sys.stdout = sys.stdout, out
    try:
        code = _cli.main(list(args))
    finally:
        sys.stdout = old
    return code, out.getvalue()


# -- info -------------------------------------------------------------------------------------------------
def test_info_exits_0_and_lists_the_stack():
    code, text = run("info")
    assert code == 0
    assert text.startswith(f"rxcuda {rxcuda.__version__} on Python")
    for dist in ("cuda-bindings", "cuda-core", "cupy-cuda13x", "nvmath-python", "reactivex"):
        assert f"  {dist}" in text


@no_gpu
def test_info_without_a_device_says_why():
    _, text = run("info")
    line = next(ln for ln in text.splitlines() if ln.startswith("no CUDA device: "))
    assert len(line) > len("no CUDA device: ")
    assert "device 0:" not in text


def test_python_dash_m_rxcuda_info():
    proc = subprocess.run(
        [sys.executable, "-m", "rxcuda", "info"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "CUDA Python stack:" in proc.stdout
    assert ("no CUDA device: " in proc.stdout) != HAS_GPU


def test_no_command_prints_help_and_exits_2(capsys):
    assert _cli.main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as e:
        _cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"rxcuda {rxcuda.__version__}"


@pytest.mark.parametrize("bad", ["0", "-4", "many"])
def test_demo_frames_must_be_positive(bad, capsys):
    with pytest.raises(SystemExit) as e:
        _cli.main(["demo", "--frames", bad])
    assert e.value.code == 2 and "must be a positive int" in capsys.readouterr().err


# -- demo without a GPU: the plan -------------------------------------------------------------------------
@no_gpu
def test_demo_without_gpu_exits_0_and_says_it_needs_a_device():
    code, text = run("demo")
    assert code == 0
    assert text.splitlines()[-1].startswith("Running it needs a CUDA device, and this machine has none: ")


@no_gpu
def test_demo_without_gpu_lists_nodes_with_dependencies():
    _, text = run("demo")
    assert "graph nodes (4, in launch order):" in text
    assert "#0 kernel vector_add/vector_add, grid 256 x block 256; after nothing" in text
    assert "#1 kernel scalar_mul/scalar_mul, grid 256 x block 256; after #0 vector_add/vector_add" in text
    assert "#2 memset reset append_above.out; after nothing" in text
    assert "after #1 scalar_mul/scalar_mul, #2 reset append_above.out" in text


@no_gpu
def test_demo_without_gpu_lists_buffers_and_tiers():
    _, text = run("demo", "--size", "1000")
    assert "vector_add.out: f32[1000], 4000 bytes, engine-owned, shared by vector_add.out and scalar_mul.x" in text
    assert "vector_add.a: f32[1000], 4000 bytes, engine-owned, written from the host (engine.write)" in text
    assert "append_above.out.count: u32[1], 4 bytes, append counter, zeroed every frame" in text
    assert "scalar_mul.scale = 3.0 (f32): parameters (exec-node update)" in text
    assert "append_above.threshold = 2.0 (f32): parameters (exec-node update)" in text
    assert "vector_add: in a: f32[1000], in b: f32[1000], out out: f32[1000]" in text


def test_demo_plan_flag_prints_the_plan_on_any_machine():
    code, text = run("demo", "--plan", "--size", "300")
    assert code == 0 and "graph nodes (4" in text and "1200 bytes" in text
    assert "Running it needs a CUDA device" in text or HAS_GPU


@no_gpu
def test_rxcuda_demo_as_a_subprocess():
    proc = subprocess.run(
        [sys.executable, "-m", "rxcuda", "demo"], capture_output=True, text=True, cwd="/", timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "needs a CUDA device" in proc.stdout and "parameters (exec-node update)" in proc.stdout


def test_plan_demo_marks_host_inputs_fed():
    blocks, desc, gp = _cli.plan_demo(ROOT / "kernels", 64)
    add = blocks[0]
    assert desc.fed == {PortRef(add.id, "a"), PortRef(add.id, "b")}
    assert len(gp.nodes) == 4 and len(desc.connections) == 2


def test_missing_kernels_folder_is_reported(tmp_path):
    code, text = run("demo", "--kernels", str(tmp_path))
    assert code == 1 and "the shipped kernels (vector_add.ptx, ...) are not in" in text
    assert str(tmp_path) in text


def test_find_kernels_prefers_the_environment(tmp_path, monkeypatch):
    (tmp_path / "vector_add.ptx").write_text("// stand-in")
    monkeypatch.setenv("RXCUDA_KERNELS", str(tmp_path))
    assert _cli.find_kernels() == tmp_path
    monkeypatch.delenv("RXCUDA_KERNELS")
    assert _cli.find_kernels() == ROOT / "kernels"


# -- the optional command hook ----------------------------------------------------------------------------
def test_optional_commands_register_when_the_module_exists(monkeypatch):
    calls = []

    def add_cli(subparsers):
        p = subparsers.add_parser("kernels")
        p.set_defaults(func=lambda args: calls.append("kernels") or 0)

    monkeypatch.setitem(sys.modules, "rxcuda.sources._build", types.SimpleNamespace(add_cli=add_cli))
    assert _cli.main(["kernels"]) == 0 and calls == ["kernels"]


def test_optional_commands_absent_is_silent(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rxcuda.sources._build", None)  # import raises ModuleNotFoundError
    parser = argparse.ArgumentParser()
    _cli._add_optional_commands(parser.add_subparsers())
    assert capsys.readouterr().err == ""


# -- the demo's run and checks, against a NumPy stand-in for the engine ----------------------------------
class FakeEngine:
    """Runs the demo's three kernels in NumPy, with the Engine methods the demo uses."""

    def __init__(self, honour_updates: bool = True, broken: bool = False):
        self.honour_updates = honour_updates
        self.device = types.SimpleNamespace(name="NumPy stand-in")
        self.blocks, self.sources, self.data = [], {}, {}
        self.counts, self.applied, self.rebuilds, self.frame = {}, None, 0, 0
        self.diagnostic_log, self.plan = [], "a plan"
        self.broken = broken

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def add(self, block):
        self.blocks.append(block)
        return block

    def connect(self, src, dst):
        self.sources[(dst.block.id, dst.name)] = (src.block.id, src.name)

    def write(self, port, array):
        self.data[(port.block.id, port.name)] = np.asarray(array, np.float32).copy()

    def _in(self, block, name):
        key = (block.id, name)
        return self.data[self.sources.get(key, key)]

    def tick(self):
        if self.broken:
            self.diagnostic_log.append(rxcuda.Diagnostic("error", "vector_add", "rebuild failed: bad kernel", 0))
            self.plan = None
            return rxcuda.Frame(1, 1.0, (), "error", False)
        values = {b.id: b.values() for b in self.blocks}
        if self.applied is None:
            tiers, self.rebuilds = ("structure",), 1
        else:
            tiers = ("parameters",) if values != self.applied else ()
        if self.applied is None or self.honour_updates:
            self.applied = values
        for b in self.blocks:
            v = self.applied[b.id]
            if b.name == "vector_add":
                self.data[(b.id, "out")] = self._in(b, "a") + self._in(b, "b")
            elif b.name == "scalar_mul":
                self.data[(b.id, "out")] = self._in(b, "x") * np.float32(v["scale"])
            elif b.name == "append_above":
                x = self._in(b, "values")
                self.data[(b.id, "out")] = x[x > np.float32(v["threshold"])]
                self.counts[b.id] = int((x > np.float32(v["threshold"])).sum())
        self.frame += 1
        return rxcuda.Frame(self.frame, 10.0 if tiers else 5.0, tiers, "ok", True)

    def read(self, port):
        return self.data[(port.block.id, port.name)].copy()

    def count(self, port):
        return self.counts[port.block.id]


def demo(frames: int, size: int = 500, **fake) -> tuple[int, str]:
    out = io.StringIO()
    code = _cli.run_demo(ROOT / "kernels", frames, size, lambda: FakeEngine(**fake), out)
    return code, out.getvalue()


def test_demo_run_passes_its_checks_and_reports_timing():
    code, text = demo(300)
    assert code == 0 and text.rstrip().endswith("OK")
    assert "rxcuda demo on NumPy stand-in" in text
    assert "per frame (tick with sync): median 5.0 us; with a hot update of 'scale': median 10.0 us" in text
    assert "5 hot updates applied through: parameters" in text
    assert "max relative error 0.00e+00" in text


def test_demo_run_reports_one_line_per_segment_with_scale_and_count():
    _, text = demo(120)
    lines = [ln for ln in text.splitlines() if ln.startswith("  frames")]
    assert [ln.split("scale")[1].split(":")[0].strip() for ln in lines] == ["3.0", "0.5", "-2.0"]
    assert all("matches NumPy" in ln for ln in lines)
    assert lines[-1].startswith("  frames  100-119")


def test_demo_run_counts_match_numpy():
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(500).astype(np.float32), rng.standard_normal(500).astype(np.float32)
    expected = int(((a + b) * np.float32(3.0) > np.float32(_cli.THRESHOLD)).sum())
    _, text = demo(50)
    assert f"{expected} of 500 values above {_cli.THRESHOLD}" in text


def test_demo_run_fails_when_hot_updates_are_lost():
    code, text = demo(120, honour_updates=False)
    assert code == 1
    assert "FAILED: 2 check(s) disagree with NumPy" in text
    assert "scalar_mul.out differs from NumPy" in text


def test_demo_run_single_frame():
    code, text = demo(1)
    assert code == 0 and "frames    0-0" in text and "median n/a" in text


def test_demo_run_reports_a_failed_build():
    code, text = demo(10, broken=True)
    assert code == 1 and "the pipeline did not build: rebuild failed: bad kernel" in text


class NaNEngine(FakeEngine):
    def read(self, port):
        out = super().read(port)
        if port.block.name == "scalar_mul":
            out[0] = np.nan
        return out


def test_demo_check_fails_on_nan():
    out = io.StringIO()
    assert _cli.run_demo(ROOT / "kernels", 5, 100, NaNEngine, out) == 1
    assert "scalar_mul.out differs from NumPy (max relative error nan)" in out.getvalue()

"""The rxcuda command without a GPU: info, the planned demo pipeline, argument and error handling, the
demo's check against NumPy, and the demo's run on the null driver.

The null driver computes nothing, so the demo's run is checked here for its flow and report (tiers, builds,
segments, a failed build); its numbers are checked on the GPU (tests/gpu/test_cli_gpu.py)."""

from __future__ import annotations

import ast
import io
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import rxcuda
from rxcuda import _cli, examples, kernels
from rxcuda.cuda import NullDriver
from rxcuda.model._describe import PortRef

ROOT = pathlib.Path(__file__).resolve().parents[2]
HAS_GPU, WHY = rxcuda.probe()
no_gpu = pytest.mark.skipif(HAS_GPU, reason="checks what a machine without a CUDA device prints")


def python_m_rxcuda(*args: str, cwd: str | pathlib.Path = "/") -> subprocess.CompletedProcess:
    """``python -m rxcuda ARGS`` in another directory, importing rxcuda from this tree."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "rxcuda", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


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
    proc = python_m_rxcuda("info", cwd=ROOT)
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


# -- errors: one line on stderr, exit status 2 -------------------------------------------------------------
def usage_error(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as e:
        _cli.main(list(args))
    captured = capsys.readouterr()
    assert e.value.code == 2 and captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    return captured.err


@pytest.mark.parametrize("bad", ["0", "-4", "many", "1.5", ""])
def test_demo_frames_must_be_positive(bad, capsys):
    err = usage_error(capsys, "demo", "--frames", bad)
    assert err.startswith("rxcuda demo: error: argument --frames: must be a positive int (got ")
    assert err.endswith("(see 'rxcuda demo --help')\n")


@pytest.mark.parametrize("bad", ["0", "-1", "x"])
def test_demo_size_must_be_positive(bad, capsys):
    assert "argument --size: must be a positive int" in usage_error(capsys, "demo", "--size", bad)


@pytest.mark.parametrize("huge", ["2147483648", "100000000000"])
def test_demo_size_must_fit_the_kernels_i32_count(huge, capsys):
    err = usage_error(capsys, "demo", "--size", huge)
    assert f"argument --size: must be at most 2147483647, the largest element count the demo's kernels take " \
           f"(got {huge})" in err


@pytest.mark.parametrize("args", [("bogus",), ("demo", "--nope"), ("demo", "--frames"), ("info", "extra")])
def test_usage_errors_are_one_line(args, capsys):
    assert ": error: " in usage_error(capsys, *args)


def test_demo_size_at_the_limit_plans(capsys):
    assert _cli.main(["demo", "--plan", "--size", str(_cli.MAX_SIZE)]) == 0
    assert f"{_cli.MAX_SIZE} float32 elements per buffer" in capsys.readouterr().out


def test_missing_kernels_folder_is_one_line_and_exit_2(tmp_path, capsys):
    assert _cli.main(["demo", "--plan", "--kernels", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("rxcuda demo: error: the demo's kernels (vector_add.ptx, scalar_mul.ptx, "
                                   "append_above.ptx) are not in " + str(tmp_path))


def test_broken_kernel_files_are_one_line_and_exit_2(tmp_path, capsys):
    stand_in_kernels(tmp_path)
    assert _cli.main(["demo", "--plan", "--kernels", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("rxcuda demo: error: ") and captured.err.count("\n") == 1
    assert "vector_add.ptx" in captured.err


def test_the_console_script_reports_a_bad_size_without_a_traceback():
    proc = python_m_rxcuda("demo", "--size", "100000000000")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("rxcuda demo: error: argument --size: must be at most 2147483647")
    assert proc.stderr.count("\n") == 1


def command_raising(monkeypatch, exc: BaseException):
    """Register an optional command 'boom' that raises ``exc``."""

    def add_cli(subparsers):
        p = subparsers.add_parser("boom")
        p.set_defaults(func=lambda args: (_ for _ in ()).throw(exc), command=p.prog)

    monkeypatch.setattr(_cli, "_add_build_commands", add_cli)


@pytest.mark.parametrize("exc", [
    rxcuda.ValidationError("vector_add.a: wrong dtype"),
    rxcuda.NoDeviceError("no driver"),
    ValueError("bad value"),
    FileNotFoundError("no such file: x.ptx"),
    UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
    rxcuda.CompileError("kernel.cu(3): error: expected a ';'\nkernel.cu(4): error: undefined"),
    MemoryError(),
])
def test_errors_rxcuda_raises_on_purpose_are_one_line_and_exit_2(exc, monkeypatch, capsys):
    command_raising(monkeypatch, exc)
    assert _cli.main(["boom"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rxcuda boom: error: ") and err.count("\n") == 1, err
    assert len(err) > len("rxcuda boom: error: \n")


def test_a_compiler_log_is_joined_onto_one_line(monkeypatch, capsys):
    command_raising(monkeypatch, rxcuda.CompileError("a.cu(3): error: one\n\na.cu(4): error: two"))
    _cli.main(["boom"])
    assert capsys.readouterr().err == "rxcuda boom: error: a.cu(3): error: one; a.cu(4): error: two\n"


def test_interrupt_exits_130(monkeypatch, capsys):
    command_raising(monkeypatch, KeyboardInterrupt())
    assert _cli.main(["boom"]) == 130
    assert capsys.readouterr().err == "rxcuda boom: interrupted\n"


def test_a_bug_keeps_its_traceback(monkeypatch):
    command_raising(monkeypatch, AttributeError("a bug"))
    with pytest.raises(AttributeError, match="a bug"):
        _cli.main(["boom"])


# -- demo without a GPU: the CPU device runs it for real ----------------------------------------------------
@no_gpu
def test_demo_without_gpu_runs_on_the_cpu_device_and_checks_numpy():
    code, text = run("demo", "--frames", "60", "--size", "4096")
    assert code == 0, text
    assert text.splitlines()[0].startswith("No CUDA device (") and "running on the CPU device" in text
    assert "rxcuda demo on CPU (rxcuda)" in text
    assert "1 hot update applied through: parameters" in text
    assert text.splitlines()[-2].startswith("check against NumPy: max relative error")
    assert text.splitlines()[-1] == "OK"


@no_gpu
def test_demo_plan_lists_nodes_with_dependencies():
    _, text = run("demo", "--plan")
    assert "graph nodes (4, in launch order):" in text
    assert "#0 kernel vector_add/vector_add, grid 256 x block 256; after nothing" in text
    assert "#1 kernel scalar_mul/scalar_mul, grid 256 x block 256; after #0 vector_add/vector_add" in text
    assert "#2 memset reset append_above.out; after nothing" in text
    assert "after #1 scalar_mul/scalar_mul, #2 reset append_above.out" in text


@no_gpu
def test_demo_plan_lists_buffers_and_tiers():
    _, text = run("demo", "--plan", "--size", "1000")
    assert "vector_add.out: f32[1000], 4000 bytes, engine-owned, shared by vector_add.out and scalar_mul.x" in text
    assert "vector_add.a: f32[1000], 4000 bytes, engine-owned, written from the host (engine.write)" in text
    assert "append_above.out.count: u32[1], 4 bytes, append counter, zeroed every frame" in text
    assert "scalar_mul.scale = 3.0 (f32): parameters (exec-node update)" in text
    assert "append_above.threshold = 2.0 (f32): parameters (exec-node update)" in text
    assert "vector_add: in a: f32[1000], in b: f32[1000], out out: f32[1000]" in text


def test_demo_plan_flag_prints_the_plan_on_any_machine():
    code, text = run("demo", "--plan", "--size", "300")
    assert code == 0 and "graph nodes (4" in text and "1200 bytes" in text
    assert "Running it needs a CUDA device" not in text  # --plan asked for the plan only: nothing was missing
    assert text.splitlines()[-1] == "  append_above.n = 300 (i32): parameters (exec-node update)"


@no_gpu
def test_rxcuda_demo_as_a_subprocess():
    proc = python_m_rxcuda("demo", "--frames", "60", "--size", "4096")
    assert proc.returncode == 0, proc.stderr
    assert "running on the CPU device" in proc.stdout and proc.stdout.splitlines()[-1] == "OK"


def test_plan_demo_marks_host_inputs_fed():
    blocks, desc, gp = _cli.plan_demo(ROOT / "kernels", 64)
    add = blocks[0]
    assert desc.fed == {PortRef(add.id, "a"), PortRef(add.id, "b")}
    assert len(gp.nodes) == 4 and len(desc.connections) == 2


def stand_in_kernels(folder: pathlib.Path) -> pathlib.Path:
    for k in _cli.DEMO_KERNELS:
        (folder / f"{k}.ptx").write_text("// stand-in")
        (folder / f"{k}.json").write_text("{}")
    return folder


def test_find_kernels_prefers_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RXCUDA_KERNELS", str(stand_in_kernels(tmp_path)))
    assert _cli.find_kernels() == tmp_path
    monkeypatch.delenv("RXCUDA_KERNELS")
    assert _cli.find_kernels() == ROOT / "kernels"  # a checkout: rxcuda.kernels is the repository's kernels/


def test_find_kernels_prefers_the_kernels_shipped_in_the_package(tmp_path, monkeypatch):
    monkeypatch.delenv("RXCUDA_KERNELS", raising=False)
    monkeypatch.setattr(_cli, "_shipped_kernels", lambda: stand_in_kernels(tmp_path))
    assert _cli.find_kernels() == tmp_path


def test_find_kernels_needs_all_three(tmp_path):
    (tmp_path / "vector_add.ptx").write_text("// stand-in")
    with pytest.raises(FileNotFoundError, match=r"scalar_mul.ptx.*are not in .*; pass --kernels DIR"):
        _cli.find_kernels(tmp_path)


# -- only the command line prints --------------------------------------------------------------------------
def printing_calls(path: pathlib.Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of each print() or sys.stdout/stderr.write() in a module."""
    found = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else func
            if isinstance(child, ast.Call):
                f = child.func
                if (isinstance(f, ast.Name) and f.id == "print") or (
                        isinstance(f, ast.Attribute) and f.attr == "write" and isinstance(f.value, ast.Attribute)
                        and f.value.attr in ("stdout", "stderr")):
                    found.append((func, child.lineno))
            visit(child, name)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def test_only_the_command_line_prints():
    """Library code logs through logging.getLogger("rxcuda") and returns what it did (issues 8 and 18): only
    the command line prints (_cli.py, and _cli_serve.py for demo --serve; the commands `kernels build` and `cache`
    too)."""
    offenders = [f"{path.relative_to(ROOT)}:{line} (in {func})"
                 for path in sorted((ROOT / "rxcuda").rglob("*.py")) if path.name not in ("_cli.py", "_cli_serve.py")
                 for func, line in printing_calls(path)]
    assert not offenders, "print in library code; log through logging.getLogger('rxcuda'): " + ", ".join(offenders)


# -- kernels build, cache: wired here, done by rxcuda.sources._build ----------------------------------------
def test_kernels_without_a_subcommand_prints_its_help_and_exits_2(capsys):
    assert _cli.main(["kernels"]) == 2 and "build" in capsys.readouterr().out
    assert _cli.main(["cache"]) == 2 and "clear" in capsys.readouterr().out


def test_kernels_build_of_a_missing_folder_is_one_line_and_exit_2(tmp_path, capsys):
    assert _cli.main(["kernels", "build", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"rxcuda kernels build: error: {tmp_path / 'nope'}: no such kernels directory\n"


# -- the demo's check against NumPy (a pure function of the arrays read back) -----------------------------
def frame_inputs(size=500, scale=3.0):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(size).astype(np.float32), rng.standard_normal(size).astype(np.float32)
    out = (a + b) * np.float32(scale)
    appended = out[out > np.float32(_cli.THRESHOLD)]
    return a, b, out, appended


def test_check_frame_accepts_numpys_results_in_any_append_order():
    a, b, out, appended = frame_inputs()
    assert _cli.check_frame(a, b, 3.0, out, appended.size, appended[::-1]) == (0.0, "")


def test_check_frame_catches_a_lost_parameter_update():
    a, b, out, appended = frame_inputs(scale=3.0)
    err, problem = _cli.check_frame(a, b, 0.5, out, appended.size, appended)
    assert problem.startswith("scalar_mul.out differs from NumPy (max relative error") and err > 1


def test_check_frame_catches_nan():
    a, b, out, appended = frame_inputs()
    out[0] = np.nan
    assert _cli.check_frame(a, b, 3.0, out, appended.size, appended)[1] == \
        "scalar_mul.out differs from NumPy (max relative error nan)"


def test_check_frame_catches_a_wrong_count_and_wrong_values():
    a, b, out, appended = frame_inputs()
    assert _cli.check_frame(a, b, 3.0, out, appended.size + 1, appended)[1] == \
        f"append count {appended.size + 1}, NumPy counts {appended.size}"
    wrong = appended.copy()
    wrong[0] += 1
    assert _cli.check_frame(a, b, 3.0, out, appended.size, wrong)[1] == "appended values differ from NumPy's selection"


def test_check_frame_catches_a_short_read():
    a, b, out, appended = frame_inputs()
    assert _cli.check_frame(a, b, 3.0, out[:-1], appended.size, appended)[0] == np.inf


# -- the demo's run on the null driver: its flow and report, not its numbers -------------------------------
def null_demo(frames: int, api: NullDriver | None = None) -> tuple[int, str]:
    api = api or NullDriver()
    out = io.StringIO()
    code = _cli.run_demo(ROOT / "kernels", frames, 500, lambda: rxcuda.Engine(driver=api), out)
    assert api.leaks() == {}
    return code, out.getvalue()


def test_demo_run_builds_once_and_takes_the_parameters_tier_for_each_scale():
    _, text = null_demo(120)
    assert text.startswith("rxcuda demo on Null Device: vector_add -> scalar_mul -> append_above(> 2.0), 500 "
                           "elements, 120 frames, scale changes every 50 frames\n")
    segments = [ln for ln in text.splitlines() if ln.startswith("  frames")]
    assert [ln.split(":")[0] for ln in segments] == [
        "  frames    0-49   scale    3.0", "  frames   50-99   scale    0.5", "  frames  100-119  scale   -2.0"]
    assert "2 hot updates applied through: parameters; graph builds in all: 1" in text


def test_demo_run_reports_what_disagrees_with_numpy():
    code, text = null_demo(60)  # the null driver runs no kernel: the check must fail, and say so
    assert code == 1 and text.rstrip().endswith("FAILED: 2 checks disagree with NumPy")
    assert "scalar_mul.out differs from NumPy" in text and "append counts not all checked" in text


def test_demo_run_single_frame():
    _, text = null_demo(1)
    assert "  frames    0-0 " in text and "median n/a" in text and "hot updates" not in text
    assert "elements, 1 frame, scale" in text  # one frame, not "1 frames"


def test_demo_run_reports_a_failed_build():
    api = NullDriver()
    api.fail("cuModuleLoadData", "CUDA_ERROR_INVALID_PTX", times=10)
    code, text = null_demo(10, api)
    assert code == 1
    assert text.splitlines()[-1].startswith("the pipeline did not build: build failed, no graph runs until it is "
                                            "fixed: ")
    assert "CUDA_ERROR_INVALID_PTX" in text


# -- a newcomer's command line (issue 19) -------------------------------------------------------------------
def test_a_kernels_folder_without_a_sidecar_names_it_in_one_line_and_exits_2(tmp_path, capsys):
    for k in _cli.DEMO_KERNELS:
        shutil.copy(ROOT / "kernels" / f"{k}.ptx", tmp_path)
        if k != "scalar_mul":
            shutil.copy(ROOT / "kernels" / f"{k}.json", tmp_path)
    assert _cli.main(["demo", "--plan", "--kernels", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"rxcuda demo: error: {tmp_path / 'scalar_mul.json'}: no such file; the demo needs the "
                            "sidecar beside each kernel (it names the parameters the demo sets); the shipped one is "
                            f"{kernels.path('scalar_mul.json')}\n")


@pytest.mark.parametrize(("argv", "err"), [
    (["--host", "0.0.0.0"], "--host only applies with --serve; add --serve, or leave it out"),
    (["--port", "8080"], "--port only applies with --serve; add --serve, or leave it out"),
    (["--seconds", "3", "--profile", "none"], "--seconds, --profile only apply with --serve; add --serve, or leave "
                                              "them out"),
])
def test_serve_options_without_serve_are_refused(argv, err, capsys):
    assert _cli.main(["demo", "--plan", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"rxcuda demo: error: {err} (see 'rxcuda demo --help')\n"


class _GoneReader(io.StringIO):
    """A stdout whose reader went away: every write raises BrokenPipeError, as a closed pipe does."""

    def __init__(self, fd: int):
        super().__init__()
        self._fd = fd

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self):
        return self._fd


def test_a_reader_that_went_away_ends_the_command_quietly_with_141(tmp_path, monkeypatch, capsys):
    with open(tmp_path / "stdout", "w") as f:
        monkeypatch.setattr(sys, "stdout", _GoneReader(f.fileno()))
        assert _cli.main(["demo", "--plan"]) == _cli.EXIT_BROKEN_PIPE == 141
    assert capsys.readouterr().err == ""


def test_rxcuda_demo_into_a_closed_pipe_exits_quietly():
    """`rxcuda demo --plan | head -1`: the reader leaves early; no traceback, no 'Broken pipe'."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "rxcuda", "demo", "--plan"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd="/", env=env)
    proc.stdout.close()  # gone before the first line: the demo's first write meets a closed pipe
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141 and err == b""


def test_examples_lists_each_with_what_it_shows():
    code, text = run("examples")
    assert code == 0
    head, *rows = text.splitlines()
    assert head.startswith("the examples shipped with rxcuda (run one: rxcuda examples NAME [ARGS]")
    assert [r.split()[0] for r in rows] == examples.names()
    assert {"quickstart", "particles", "hot_reload"} <= set(examples.names())
    quick = next(r for r in rows if r.split()[0] == "quickstart")
    assert quick.endswith("  Quickstart: two shipped kernels, connected, launched as one CUDA graph per frame.")


def test_an_unknown_example_is_one_line_with_did_you_mean(capsys):
    assert _cli.main(["examples", "quikstart"]) == 2
    assert capsys.readouterr().err == ("rxcuda examples: error: no example named 'quikstart'; did you mean quickstart? "
                                       f"the examples are {', '.join(examples.names())}\n")


@no_gpu
def test_rxcuda_examples_name_runs_it_from_any_directory(tmp_path):
    proc = python_m_rxcuda("examples", "quickstart", cwd=tmp_path)  # on the CPU device, saying so
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"no CUDA device ({WHY}): running on the CPU device\n")
    assert proc.stdout.count("max error vs NumPy") == 3


def test_a_gone_reader_without_a_file_descriptor_ends_quietly_too(monkeypatch, capsys):
    class Gone(io.StringIO):  # io.StringIO.fileno raises io.UnsupportedOperation
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Gone())
    assert _cli.main(["examples"]) == 141
    assert capsys.readouterr().err == ""

"""The examples ship as the package rxcuda.examples: listed with what each shows, run as
``python -m rxcuda.examples.NAME`` from any directory, and on a machine without a GPU each says what it needs in
one line and exits non-zero."""

import doctest
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

import rxcuda
from rxcuda import examples

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.py") if not p.stem.startswith("_"))
# examples that run without a GPU too (on the null driver, saying so); every other one needs a device
RUN_ANYWHERE = {"distributed"}
# examples whose pipelines the CPU device runs where there is no GPU (docs/cpu.md; train_mlp on the tensor functions'
# NumPy backend; particles_gl drawn through EGL, skipping without moderngl or an EGL context; two_gpus on two
# positions of the CPU device)
ON_CPU = {"hot_reload", "particles", "particles_gl", "peaks", "quickstart", "sensor_params", "solver", "train_mlp",
          "two_gpus", "video_filter"}
# the argument each runs with in CI (frames or steps: "1" unless it needs more to show what it checks; two_gpus
# checks pipelined frames from the second on)
CI_ARGS = {"train_mlp": "40", "two_gpus": "3"}
# what each prints last when its numbers matched NumPy's (or its own check passed)
OK_LINE = {"particles": "OK: 1 frames match NumPy", "peaks": "OK: 1 frames, ", "solver": "OK: every solve met tol=",
           "train_mlp": "OK: the loss went down", "video_filter": "OK: ",
           "particles_gl": "OK: 1 frames drawn by OpenGL from the vertex buffer CPU (rxcuda) wrote, 1 framebuffers",
           "two_gpus": "OK: 3 frames over two devices and 2 pipelined frames match NumPy"}
HAS_GPU, WHY = rxcuda.probe()


def python_m(module: str, *args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def test_there_are_examples_and_the_package_lists_them_all():
    assert set(EXAMPLES) >= {"quickstart", "sensor_params", "hot_reload", "particles", "peaks", "solver"}
    assert examples.names() == EXAMPLES
    assert pathlib.Path(examples.__file__).parent.resolve() == ROOT / "examples"


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_says_what_it_shows_and_how_to_run_it(name):
    text = (ROOT / "examples" / f"{name}.py").read_text()
    assert examples.describe(name).endswith(".") and len(examples.describe(name)) > 20
    assert f"    python -m rxcuda.examples.{name}" in text  # its usage line
    # shipped kernels by name, never a path into the repository
    assert "parents[1]" not in text and '"kernels/' not in text and "examples/" not in text


def test_the_package_docstrings_run():
    from rxcuda import kernels

    for module in (examples, kernels):
        result = doctest.testmod(module)
        assert result.attempted >= 2 and result.failed == 0, module.__name__


def test_an_unknown_example_says_which_there_are():
    with pytest.raises(ValueError, match=r"no example named 'quikstart'; did you mean quickstart\? the examples "
                                         r"are .*hot_reload, "):
        examples.describe("quikstart")
    with pytest.raises(ValueError, match="no example named 'nothing_like_it'; the examples are "):
        examples.run("nothing_like_it")


def test_python_dash_m_rxcuda_examples_lists_them(tmp_path):
    proc = python_m("rxcuda.examples", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()[1:]] == EXAMPLES


@pytest.mark.skipif(HAS_GPU, reason="checks what a machine without a CUDA device prints")
@pytest.mark.parametrize("name", sorted(ON_CPU))
def test_an_example_without_a_gpu_runs_on_the_cpu_device(name, tmp_path):
    if name == "particles_gl" and importlib.util.find_spec("moderngl") is None:
        pytest.skip("particles_gl draws with moderngl, which this Python lacks: pip install '.[gl]'")
    proc = python_m(f"rxcuda.examples.{name}", CI_ARGS.get(name, "1"), cwd=tmp_path)
    if name == "particles_gl" and "no OpenGL context through EGL" in proc.stderr:
        pytest.skip(proc.stderr.strip())  # no libEGL or no EGL vendor library (Debian: libegl1, libegl-mesa0)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"no CUDA device ({WHY}): running on the CPU device")
    if name in OK_LINE:
        assert lines[-1].startswith(OK_LINE[name]), proc.stdout
    if name == "two_gpus":  # both halves on the CPU device, every frame checked: 3 ticks, then 2 pipelined
        assert lines[0].endswith("running on the CPU device, both halves on it as two devices"), proc.stdout
        assert "devices (0, 0) (CPU (rxcuda), CPU (rxcuda)): copies go local" in lines, proc.stdout
        assert sum("max error vs NumPy" in line for line in lines) == 5, proc.stdout
        assert [line.split(":")[0] for line in lines if "tiers=" in line] == ["frame 1", "frame 2", "frame 3"]
        assert [line.split("tiers=")[1].split(" ")[0] for line in lines if "tiers=" in line] == \
            ["('structure',)", "('parameters',)", "('parameters',)"]  # a new scale: a patch, no rebuild
    if name == "peaks":  # each refined peak beside NumPy's: 'peak at   4228.78 Hz (NumPy   4228.78)'
        peaks = [line.split("peak at")[1].split("Hz (NumPy") for line in lines if "peak at" in line]
        assert peaks and all(float(a) == float(b.split(")")[0]) for a, b in peaks)
    assert list(tmp_path.iterdir()) == []  # nothing left in the current directory


@pytest.mark.skipif(HAS_GPU, reason="checks what a machine without a CUDA device prints")
@pytest.mark.parametrize("name", [n for n in EXAMPLES if n not in RUN_ANYWHERE | ON_CPU])
def test_an_example_without_a_gpu_says_what_it_needs_in_one_line(name, tmp_path):
    proc = python_m(f"rxcuda.examples.{name}", "1", cwd=tmp_path)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr == f"rxcuda.examples.{name} runs on a CUDA device, and this machine has none: {WHY}\n"
    assert list(tmp_path.iterdir()) == []  # nothing left in the current directory


@pytest.mark.skipif(HAS_GPU, reason="checks what a machine without a CUDA device prints")
def test_two_gpus_refused_the_cpu_device_says_what_it_needs_in_one_line(tmp_path):
    """RXCUDA_DEVICE=cuda refuses the CPU device: the example then says in one line that it needs a CUDA device."""
    proc = subprocess.run([sys.executable, "-m", "rxcuda.examples.two_gpus", "1"], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "RXCUDA_DEVICE": "cuda"},
                          timeout=120)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr == f"rxcuda.examples.two_gpus runs on a CUDA device, and this machine has none: {WHY}\n"


def test_run_sets_argv_for_the_example_and_restores_it(monkeypatch):
    seen = {}

    def fake_run_module(module, run_name, alter_sys):
        seen.update(module=module, run_name=run_name, argv=sys.argv[:])

    monkeypatch.setattr(examples.runpy, "run_module", fake_run_module)
    before = sys.argv[:]
    examples.run("particles", ["200"])
    assert seen == {"module": "rxcuda.examples.particles", "run_name": "__main__",
                    "argv": ["rxcuda.examples.particles", "200"]}
    assert sys.argv == before


def test_a_checkout_on_pythonpath_without_an_install_finds_the_kernels_and_examples(tmp_path):
    """The GPU batch runs this tree from PYTHONPATH; `python -S` leaves out the editable install's finder (a .pth
    hook), so only rxcuda/__init__.py's mapping of kernels/ and examples/ can find them."""
    import sysconfig

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]])}
    code = ("import sys, rxcuda, rxcuda.examples as e; "
            "assert not [f for f in sys.meta_path if 'editable' in repr(f).lower()]; "
            "print(rxcuda.kernels.path('vector_add')); print(e.__file__)")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(ROOT / "kernels" / "vector_add.ptx"), str(ROOT / "examples" / "__init__.py")]


@pytest.mark.skipif(HAS_GPU, reason="checks the CPU-device run of a machine without a CUDA device")
def test_the_distributed_example_runs_on_cpu_device_workers_and_matches_numpy(tmp_path):
    pytest.importorskip("ray", reason="examples/distributed.py runs on Ray: pip install '.[ray]'")
    proc = subprocess.run([sys.executable, "-m", "rxcuda.examples.distributed", "3"], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("no CUDA device (") and "the workers run on the CPU device" in proc.stdout
    assert "links: {'gain.out -> level.x': 'host'}" in proc.stdout
    assert "max error vs NumPy 0.00e+00" in proc.stdout  # every frame checked: the two scales, exact
    assert "3 frames on workers camera, filter; last frame's tiers {'camera': (), 'filter': ('parameters',)}" \
        in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_the_distributed_example_without_ray_beside_a_folder_named_ray_says_so_in_one_line(tmp_path):
    """Ray's local cluster leaves a folder named ray in the temp folder; without Ray installed, ``import ray`` run
    there finds that folder as an empty namespace package. The example still says in one line that Ray is missing
    (here Ray is hidden: 'ray' is looked for in the current folder only, as where it is not installed)."""
    (tmp_path / "ray").mkdir()
    code = ("import importlib.machinery, os, runpy, sys\n"
            "class NoRay:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'ray':\n"
            "            return importlib.machinery.PathFinder.find_spec('ray', [os.getcwd()])\n"
            "sys.meta_path.insert(0, NoRay())\n"
            f"runpy.run_path({str(ROOT / 'examples' / 'distributed.py')!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == ("rxcuda.examples.distributed runs on Ray, which is not installed: pip install '.[ray]' "
                           "from a checkout of rxcuda (docs/getting-started.md#install)\n")


def test_the_distributed_engine_without_ray_beside_a_folder_named_ray_says_ray_is_not_installed(monkeypatch,
                                                                                               tmp_path):
    import types

    from rxcuda.distributed._ray import ray_module

    folder = types.ModuleType("ray")
    folder.__path__ = [str(tmp_path / "ray")]  # what importing a folder named ray without Ray gives
    monkeypatch.setitem(sys.modules, "ray", folder)
    with pytest.raises(ImportError, match=r"Ray, which is not installed: pip install '\.\[ray\]' .*only the folder "):
        ray_module()


def test_the_gallery_lists_every_example_with_what_it_needs():
    """docs/examples.md has a row per example (and the notebook): how to run it, what it needs, what it shows; an
    example that exits asking for an extra names that extra in its row."""
    import re

    rows = {}
    for line in (ROOT / "docs" / "examples.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 4 and cells[0] not in ("example", "---|---|---|---"):
            rows[cells[0]] = cells
    assert set(rows) == {*EXAMPLES, "notebook.ipynb"}
    for name in EXAMPLES:
        _, run, needs, shows = rows[name]
        assert run.startswith(f"`python -m rxcuda.examples.{name}") and needs and len(shows) > 80
        text = (ROOT / "examples" / f"{name}.py").read_text()
        for extra in re.findall(r"pip install '\.\[(\w+)\]'", text):
            assert f"'.[{extra}]'" in needs, f"{name} asks for the {extra} extra; its row does not say so"

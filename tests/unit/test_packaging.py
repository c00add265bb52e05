"""What `pip install .` delivers: the wheel carries every module, the shipped kernels and the examples, and the
installed package runs `rxcuda demo --plan`, lists its examples and loads kernels by name from any directory;
the dependency pins say what the project needs."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DEMO_KERNELS = ("vector_add", "scalar_mul", "append_above")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """The wheel `pip wheel .` builds, from a copy of this tree (setuptools writes build/ into the source)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "*.so"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
         str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (found,) = (tmp / "dist").glob("rxcuda-*.whl")
    return found


def test_the_wheel_ships_the_demo_kernels_from_the_repository_kernels_folder(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for k in DEMO_KERNELS:
            for ext in (".ptx", ".json", ".cu"):
                assert f"rxcuda/kernels/{k}{ext}" in names
                assert z.read(f"rxcuda/kernels/{k}{ext}") == (ROOT / "kernels" / f"{k}{ext}").read_bytes()


def test_the_wheel_ships_every_kernel_and_example_as_packages(wheel):
    """kernels/ and examples/ are the packages rxcuda.kernels and rxcuda.examples (pyproject's package-dir)."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for folder, package in (("kernels", "rxcuda/kernels"), ("examples", "rxcuda/examples")):
            files = sorted(p.name for p in (ROOT / folder).iterdir()
                           if p.suffix in (".py", ".ptx", ".json", ".cu") and p.is_file())
            assert "__init__.py" in files
            for name in files:
                assert z.read(f"{package}/{name}") == (ROOT / folder / name).read_bytes(), name
    assert "rxcuda/examples/__main__.py" in names


def test_the_wheel_has_every_module(wheel):
    """pyproject.toml lists the packages by hand (to map kernels/ into the package): a new folder under
    rxcuda/ must be added there."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "rxcuda").rglob("*.py")
               if "__pycache__" not in p.parts}
    missing = sorted(modules - names)
    assert not missing, f"not in the wheel (add their packages to [tool.setuptools] packages): {missing}"


def test_the_installed_package_plans_the_demo_from_another_directory(wheel, tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q",
                           "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RXCUDA_KERNELS"}
    env["PYTHONPATH"] = str(site)  # ahead of this checkout (the test environment's editable install)

    where = subprocess.run(
        [sys.executable, "-c", "import rxcuda, rxcuda._cli as c; print(rxcuda.__file__); print(c.find_kernels())"],
        capture_output=True, text=True, cwd=elsewhere, env=env, timeout=120)
    assert where.returncode == 0, where.stderr
    module, kernels = where.stdout.split()
    assert module == str(site / "rxcuda" / "__init__.py")
    assert kernels == str(site / "rxcuda" / "kernels")

    demo = subprocess.run([sys.executable, "-m", "rxcuda", "demo", "--plan", "--size", "1000"],
                          capture_output=True, text=True, cwd=elsewhere, env=env, timeout=120)
    assert demo.returncode == 0, demo.stderr
    assert "graph nodes (4, in launch order):" in demo.stdout
    assert "scalar_mul.scale = 3.0 (f32)" in demo.stdout

    listing = subprocess.run([sys.executable, "-m", "rxcuda.examples"], capture_output=True, text=True,
                             cwd=elsewhere, env=env, timeout=120)
    assert listing.returncode == 0, listing.stderr
    assert "  particles  " in listing.stdout and "  quickstart  " in listing.stdout

    by_name = subprocess.run(
        [sys.executable, "-c", "import rxcuda; b = rxcuda.Block.from_kernel('vector_add', size=8); "
         "print(b.description.kernels[0].code.origin)"], capture_output=True, text=True, cwd=elsewhere, env=env,
        timeout=120)
    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout.strip() == str(site / "rxcuda" / "kernels" / "vector_add.ptx")


def requirement(name: str, deps: list[str]) -> str:
    (found,) = [d for d in deps if d.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip() == name]
    return found


def test_pins_match_what_the_dependencies_accept():
    deps = PYPROJECT["project"]["dependencies"]
    assert requirement("nvmath-python", deps) == "nvmath-python>=1.0,<2"  # its bindings are experimental
    assert requirement("numpy", deps) == "numpy>=2.0,<2.6"  # what every cupy-cuda13x 14.x release accepts
    assert requirement("cupy-cuda13x", deps) == "cupy-cuda13x>=14,<15"


def test_the_libs_extra_installs_the_cuda_13_libraries():
    (libs,) = PYPROJECT["project"]["optional-dependencies"]["libs"]
    name, _, version = libs.partition("==")
    assert version == "13.*"
    assert name == "cuda-toolkit[cublas,cufft,curand,cusolver,cusparse]"


def test_the_built_in_kernels_ship_in_the_wheel(wheel):
    """Regions, GPU-driven batches and profiling load rxcuda/cuda/_conditions.fatbin (linked against
    libcudadevrt at development time): an installed rxcuda carries it, so no toolkit is needed."""
    fatbin = (ROOT / "rxcuda" / "cuda" / "_conditions.fatbin").read_bytes()
    assert len(fatbin) > 10_000 and fatbin[:4] == bytes.fromhex("50ed55ba")  # a fatbin's magic number
    with zipfile.ZipFile(wheel) as z:
        assert z.read("rxcuda/cuda/_conditions.fatbin") == fatbin
        assert "rxcuda/cuda/_conditions.cu" in z.namelist()


def test_the_wheel_carries_the_compiled_parameter_path_built_with_it(wheel):
    """setup.py builds rxcuda/cuda/_hotpath.c into the extension module rxcuda.cuda._hotpath when the wheel is built
    (the copy the wheel is built from holds no compiled module): the wheel carries it, for this interpreter and
    platform, and not the C source, since nothing is compiled where it is installed."""
    import importlib.machinery

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        built = [n for n in names if n.startswith("rxcuda/cuda/_hotpath")]
        suffixes = importlib.machinery.EXTENSION_SUFFIXES
        assert [n for n in built if any(n == "rxcuda/cuda/_hotpath" + s for s in suffixes)]
        assert built and all(not n.endswith(".c") for n in built), built
        (meta,) = [n for n in names if n.endswith(".dist-info/WHEEL")]
        assert "Root-Is-Purelib: false" in z.read(meta).decode()  # a platform wheel, as a compiled module needs


def test_the_compiled_parameter_path_is_an_optional_extension_of_the_build():
    """An install without a C compiler still works (the Python path, rxcuda/cuda/_native.py): the extension is
    marked optional, so its failed build is a warning, and nothing else of the package is compiled. The module is
    told the SHA-256 of the source it is built from (rxcuda/cuda/_native.py refuses one built from another)."""
    import hashlib
    import runpy

    import setuptools

    asked: dict = {}
    setup = setuptools.setup
    setuptools.setup = lambda **kwargs: asked.update(kwargs)
    try:
        runpy.run_path(str(ROOT / "setup.py"))
    finally:
        setuptools.setup = setup
    (ext,) = asked["ext_modules"]
    assert (ext.name, ext.sources, ext.optional) == ("rxcuda.cuda._hotpath", ["rxcuda/cuda/_hotpath.c"], True)
    digest = hashlib.sha256((ROOT / "rxcuda" / "cuda" / "_hotpath.c").read_bytes()).hexdigest()
    assert ext.define_macros == [("RXCUDA_HOTPATH_SOURCE", f'"{digest}"')]
    pyproject = PYPROJECT["tool"]["setuptools"]
    assert "_hotpath.c" not in pyproject["package-data"]["rxcuda.cuda"]  # (the sdist carries it as the source)


def test_a_build_without_a_compiler_still_gives_a_wheel_without_the_module(tmp_path):
    """Where the C compiler fails, `pip wheel .` still succeeds (the extension is optional) and the wheel has no
    compiled module: rxcuda then takes its Python path."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "*.so", "site", "tests", "bench",
        "docs"))
    env = dict(os.environ, CC="false")  # a compiler that fails every file
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
         str(src)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (found,) = (tmp_path / "dist").glob("rxcuda-*.whl")
    with zipfile.ZipFile(found) as z:
        assert "rxcuda/cuda/_native.py" in z.namelist()
        assert not [n for n in z.namelist() if n.startswith("rxcuda/cuda/_hotpath")]


def test_the_wheel_ships_the_live_views_page(wheel):
    """engine.serve() serves its page from the package (no CDN): every file of rxcuda/view/static is in the
    wheel, byte for byte."""
    static = ROOT / "rxcuda" / "view" / "static"
    files = sorted(p.name for p in static.iterdir() if p.is_file())
    assert {"index.html", "app.js", "style.css"} <= set(files)
    with zipfile.ZipFile(wheel) as z:
        for name in files:
            assert z.read(f"rxcuda/view/static/{name}") == (static / name).read_bytes()


def test_make_test_checks_the_installed_wheel_from_another_directory():
    """tools/check_wheel.sh (its own "== wheel" step, before pytest's summary line) builds the wheel, installs it
    into a fresh environment and runs the demo's plan, the examples' listing and the no-GPU blocks of the README
    and docs/."""
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("\ntest: ", 1)[1].split("\n\n", 1)[0]
    assert 'echo "== wheel"; sh tools/check_wheel.sh $(VENV)/bin/python || status=1' in recipe
    assert recipe.index("== wheel") < recipe.index("== pytest")
    script = (ROOT / "tools" / "check_wheel.sh").read_text()
    for step in ("pip wheel --no-deps --no-build-isolation", "-m venv --without-pip", "install --no-deps --no-index",
                 "rxcuda\" demo --plan", "-m rxcuda.examples", "all_snippets()", "env -u PYTHONPATH"):
        assert step in script, step


def _install_inputs() -> list[str]:
    """The files whose change makes `make demo`/`make test` install rxcuda again (the Makefile's INSTALL_INPUTS)."""
    (line,) = [ln for ln in (ROOT / "Makefile").read_text().splitlines() if ln.startswith("INSTALL_INPUTS :=")]
    return line.split(":=", 1)[1].split()


def _dry_run(target: str, tmp_path: pathlib.Path) -> str:
    """What `make TARGET` would run in a fresh clone (no .venv): make -n in a folder with the Makefile and the
    other files the install depends on only."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for name in _install_inputs():
        if not (tmp_path / name).exists():  # (a second run keeps the copies, and their times)
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # under make test
    proc = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=env)
    return proc.stdout


def test_make_demo_installs_only_what_the_demo_runs_and_make_test_the_dev_tools(tmp_path):
    demo = _dry_run("demo", tmp_path)
    assert "pip install -q -e . " in demo and "[dev]" not in demo and demo.rstrip().endswith(".venv/bin/rxcuda demo")
    assert "pip install -q -e '.[dev]'" in _dry_run("test", tmp_path)
    # the demo needs nothing of an extra: the quickstart's plan runs with rxcuda's own requirements
    # (tools/check_wheel.sh runs rxcuda demo --plan in an environment with exactly those)
    assert "make_env \"$tmp/venv\"\n" in (ROOT / "tools" / "check_wheel.sh").read_text()


def test_make_installs_again_when_setup_py_or_the_compiled_paths_source_changes(tmp_path):
    """The editable install builds rxcuda/cuda/_hotpath.c in place (setup.py); a checkout that pulls a new one must
    build it again, so `make demo` and `make test` install again when setup.py or the C source is newer than the
    last install, as they do for pyproject.toml (rxcuda/cuda/_native.py refuses a module built from another source,
    so a stale one would only cost the Python path)."""
    assert {"pyproject.toml", "setup.py", "rxcuda/cuda/_hotpath.c", "Makefile"} <= set(_install_inputs())
    _dry_run("demo", tmp_path)  # (copies the inputs)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").touch()
    later = time.time() + 10
    for stamp in (".installed", ".installed-core"):
        (tmp_path / ".venv" / stamp).touch()
        os.utime(tmp_path / ".venv" / stamp, (later, later))
    assert "pip install" not in _dry_run("demo", tmp_path)
    for changed in ("setup.py", "rxcuda/cuda/_hotpath.c"):
        os.utime(tmp_path / changed, (later + 10, later + 10))
        assert "pip install -q -e . " in _dry_run("demo", tmp_path), changed
        assert "pip install -q -e '.[dev]'" in _dry_run("test", tmp_path), changed
        later += 20
        for stamp in (".installed", ".installed-core"):
            os.utime(tmp_path / ".venv" / stamp, (later, later))

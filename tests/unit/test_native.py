"""The compiled parameter path (rxcuda/cuda/_hotpath.c, the extension module built with the package by setup.py and
loaded by rxcuda/cuda/_native.py): nothing compiled at import, and the fallback where it was not built; ``Apply``
writing every argument type exactly as NumPy does and calling the driver function through its
address with the node's arguments; ``drain_one`` doing what the Python drain does; and an engine on the null
driver making the same driver calls, with the same arguments, on both paths."""

import ctypes
import logging
import threading

import numpy as np
import pytest
from _folding import while_a_producer_folds

from rxcuda.cuda import _native

native = _native.hotpath()
needs_native = pytest.mark.skipif(native is None, reason=f"the compiled path was not built here: {_native.why_not} "
                                                         "(pip install -e . with a C compiler and the Python headers)")

SET_PARAMS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class Recorder:
    """A C-callable stand-in for cuGraphExecKernelNodeSetParams: records (exec, node, params) and the argument
    words as they were at the call; returns ``result``."""

    def __init__(self, words: np.ndarray, result: int = 0):
        self.calls: list = []
        self.words = words
        self.result = result
        self.fn = SET_PARAMS(self._call)
        self.address = ctypes.cast(self.fn, ctypes.c_void_p).value

    def _call(self, graph_exec, node, params):
        self.calls.append((graph_exec, node, params, self.words.copy()))
        return self.result


def _raise_for(err):
    raise RuntimeError(f"driver error {err}")


KINDS = {"f": np.float32, "d": np.float64, "e": np.float16, "b": np.int8, "h": np.int16, "i": np.int32,
         "q": np.int64, "B": np.uint8, "H": np.uint16, "I": np.uint32, "Q": np.uint64, "?": np.bool_}


def _draw(rng, dt):
    if dt == np.bool_:
        return bool(rng.integers(0, 2))
    if np.issubdtype(dt, np.floating):
        return float(rng.standard_normal() * 10.0 ** rng.integers(-3, 4))
    info = np.iinfo(dt)
    return int(rng.integers(info.min, info.max, endpoint=True, dtype=dt))


@needs_native
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_apply_writes_each_type_as_numpy_does_and_calls_the_function_with_the_nodes_arguments(kind):
    rng = np.random.default_rng()
    words = np.zeros(4, np.uint64)
    view = words.view(KINDS[kind])
    idx = 3 if view.itemsize < 8 else 1  # not the first element: the address must include the index
    rec = Recorder(words)
    apply = native.Apply(((kind, view.ctypes.data + idx * view.itemsize, rec.address, 0x1234, 0x5678, 0x9ABC, None,
                           view),), None, None, _raise_for)
    expect = np.zeros(4, np.uint64)
    for _ in range(50):
        value = _draw(rng, KINDS[kind])
        assert apply(value) is True
        expect.view(KINDS[kind])[idx] = value  # NumPy's own conversion, into a copy
        np.testing.assert_array_equal(words, expect)
        assert rec.calls[-1][:3] == (0x1234, 0x5678, 0x9ABC)
        np.testing.assert_array_equal(rec.calls[-1][3], expect)  # the value was written before the call
    assert len(rec.calls) == 50


@needs_native
def test_apply_with_bounds_refuses_a_value_outside_them_and_touches_nothing():
    words = np.zeros(2, np.uint64)
    view = words.view(np.int32)
    rec = Recorder(words)
    apply = native.Apply((("i", view.ctypes.data, rec.address, 1, 2, 3, None, view),), 0, 100, _raise_for)
    assert apply(100) is True and view[0] == 100
    assert apply(101) is False and apply(-1) is False
    assert view[0] == 100 and len(rec.calls) == 1


@needs_native
def test_apply_reaches_every_target_and_a_driver_error_raises_through_raise_for():
    words = np.zeros(4, np.uint64)
    f32 = words.view(np.float32)
    ok, bad = Recorder(words), Recorder(words, result=700)
    apply = native.Apply((("f", f32.ctypes.data, ok.address, 1, 10, 100, None, f32),
                          ("f", f32.ctypes.data + 8, ok.address, 1, 11, 101, None, f32)), None, None, _raise_for)
    assert apply(2.5) is True
    assert [c[1] for c in ok.calls] == [10, 11] and f32[0] == f32[2] == 2.5
    failing = native.Apply((("f", f32.ctypes.data, bad.address, 1, 12, 102, None, f32),), None, None, _raise_for)
    with pytest.raises(RuntimeError, match="driver error 700"):
        failing(3.5)


@needs_native
def test_apply_without_a_function_address_calls_the_bound_update():
    words = np.zeros(1, np.uint64)
    view = words.view(np.float64)
    seen = []
    apply = native.Apply((("d", view.ctypes.data, 0, 0, 0, 0, lambda: seen.append(view[0]) or 0, view),), None,
                         None, _raise_for)
    assert apply(1.25) is True and seen == [1.25]
    failing = native.Apply((("d", view.ctypes.data, 0, 0, 0, 0, lambda: 999, view),), None, None, _raise_for)
    with pytest.raises(RuntimeError, match="driver error 999"):
        failing(2.0)


@needs_native
def test_apply_refuses_bad_targets_with_a_clear_error():
    view = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="no argument type"):
        native.Apply((("z", view.ctypes.data, 0, 0, 0, 0, lambda: 0, view),), None, None, _raise_for)
    with pytest.raises(TypeError, match="each target is"):
        native.Apply((("f", view.ctypes.data),), None, None, _raise_for)
    with pytest.raises(TypeError, match="callable update"):
        native.Apply((("f", view.ctypes.data, 0, 0, 0, 0, None, view),), None, None, _raise_for)
    with pytest.raises(ValueError, match="address is 0"):
        native.Apply((("f", 0, 0, 0, 0, 0, lambda: 0, view),), None, None, _raise_for)
    apply = native.Apply((("f", view.ctypes.data, 0, 0, 0, 0, lambda: 0, view),), None, None, _raise_for)
    with pytest.raises(TypeError):
        apply("2.5")  # (the setter's check lets only numbers through; a string still raises, and writes nothing)
    assert view[0] == 0


class _Pending:
    """The attributes drain_one reads, as PendingPlan has them."""

    def __init__(self, params: dict, count: int, others: int = 0):
        self._lock = threading.Lock()
        self._params = params
        self.count = count
        self.others = others


def _compiled(params: dict, count: int, others: int = 0):
    """The engine's pending plan (its fields in C: rxcuda.engine._runtime.pending_plan), the one kind of pending
    plan the compiled drain takes, holding ``params``, ``count`` and ``others``."""
    from rxcuda.engine._runtime import pending_plan

    pending = pending_plan()
    pending._params, pending.count, pending.others = params, count, others
    return pending


def _both(make_pending, table):
    """The compiled drain on the engine's pending plan made to hold what ``make_pending()`` holds, and the Python
    drain on both."""
    from rxcuda.engine._update import _drain_one

    def engines():
        was = make_pending()
        return _compiled(was._params, was.count, was.others)

    out = []
    for drain, make in ((native.drain_one, engines), (_drain_one, make_pending), (_drain_one, engines)):
        pending = make()
        result = drain(pending, table)
        out.append((result, dict(pending._params), pending.count, pending._lock.locked()))
    return out


@needs_native
@pytest.mark.parametrize("case", ["applied", "refused", "no apply", "several", "none"])
def test_drain_one_does_what_the_python_drain_does(case):
    applied = []

    def take(v):
        applied.append(v)
        return case != "refused"

    table = {(1, "scale"): (take if case != "no apply" else None, ("mul",)), (2, "gain"): (take, ("amp",))}
    params = {"several": {(1, "scale"): 2.0, (2, "gain"): 3.0}, "none": {}}.get(case, {(1, "scale"): 2.0})
    native_out, python_out, fields_out = _both(lambda: _Pending(dict(params), count=5, others=0), table)
    assert native_out == python_out == fields_out
    (names, rest, events), left, count, locked = native_out
    assert events == 5 and count == 0 and not locked and left == {}
    if case == "applied":
        assert names == ("mul",) and rest is None
    else:
        assert names is None and rest == params


@needs_native
def test_drain_one_makes_a_missing_hot_entry_through_the_tables_missing():
    class Table(dict):
        def __missing__(self, key):
            value = self[key] = (lambda v: True, (f"made {key[1]}",))
            return value

    table = Table()
    pending = _compiled({(7, "k"): 1}, count=1)
    names, rest, events = native.drain_one(pending, table)
    assert (names, rest, events) == (("made k",), None, 1) and (7, "k") in table


@needs_native
def test_drain_one_leaves_the_lock_free_when_apply_raises():
    def boom(v):
        raise ValueError("bad")

    pending = _compiled({(1, "a"): 1.0}, count=1)
    with pytest.raises(ValueError, match="bad"):
        native.drain_one(pending, {(1, "a"): (boom, ("x",))})
    assert not pending._lock.locked() and pending._params == {} and pending.count == 0


def _engine_calls(use_native: bool, values: list) -> list:
    """The exec-node updates (node, argument words) an engine on the null driver makes for ``values``."""
    import rxcuda
    from rxcuda.cuda import NullDriver

    api = NullDriver()
    with rxcuda.Engine(driver=api) as engine:
        assert engine._updater.use_native(use_native) is use_native
        blk = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=256, scale=1.0))
        engine.write(blk["x"], np.ones(256, np.float32))
        engine.tick()
        words = engine._rt.graph.nodes[0].storage.words
        out = []
        start = len(api.calls)
        for name, value in values:
            blk.params[name].value = value
            frame = engine.tick()
            out.append((frame.tiers, words.copy()))
        calls = [(name, int(args[1])) for name, args in api.calls[start:] if name.startswith("cuGraphExec")]
        return out, calls, [d.message for d in engine._rt.reporter.log]


@needs_native
def test_drain_one_waits_for_a_producer_inside_its_section_and_sees_its_value():
    """The lock is taken only when someone holds it: a producer holding it (mid-fold) is waited for, and what it
    folded before releasing is drained with the rest."""
    pending = _compiled({(1, "a"): 1.0}, count=1)
    names, rest, events = while_a_producer_folds(pending, lambda: native.drain_one(pending, {}))
    assert (names, rest, events) == (None, {(1, "a"): 1.0, (2, "b"): 2.0}, 2)
    assert pending.count == 0 and pending._params == {} and not pending._lock.locked()


@needs_native
def test_drain_one_refuses_a_params_that_is_not_a_dict_and_a_pending_plan_that_is_not_compiled():
    pending = _compiled([], count=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="drain_one"):
        native.drain_one(pending, {})
    with pytest.raises(TypeError, match="drain_one"):
        native.drain_one(pending)
    with pytest.raises(TypeError, match="not a PendingBase"):
        native.drain_one(_Pending({(1, "a"): 1.0}, count=1), {})


@needs_native
def test_an_engine_makes_the_same_driver_calls_with_the_same_arguments_on_both_paths():
    rng = np.random.default_rng()
    values = []
    for i in range(40):
        values.append(("scale", float(rng.uniform(-5, 5))) if i % 3 else ("n", int(rng.integers(0, 257))))
    values.append(("n", 256))
    (frames_c, calls_c, said_c), (frames_py, calls_py, said_py) = _engine_calls(True, values), \
        _engine_calls(False, values)
    assert calls_c == calls_py and said_c == said_py and len(calls_c) == len(values)
    for (tiers_c, words_c), (tiers_py, words_py) in zip(frames_c, frames_py, strict=True):
        assert tiers_c == tiers_py == ("parameters",)
        np.testing.assert_array_equal(words_c, words_py)


_PYTHON_PATH_SCRIPT = """
import numpy as np
import rxcuda
from rxcuda.blocks._params import Parameter, _Fields
from rxcuda.cuda import NullDriver, _native
from rxcuda.streams._coalesce import PendingPlan

assert _native.hotpath() is None and "RXCUDA_NATIVE=0" in _native.why_not
assert Parameter.__mro__[1] is _Fields
with rxcuda.Engine(driver=NullDriver()) as engine:
    assert engine._updater.native is None and type(engine._rt.pending) is PendingPlan
    seen = []
    sub = engine.updates.subscribe(seen.append)
    blk = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=64, scale=1.0))
    engine.write(blk["x"], np.ones(64, np.float32))
    engine.tick()
    blk.params["scale"].value = 2.0
    assert engine.tick().tiers == ("parameters",)
    assert seen[-1].tiers == ("parameters",) and seen[-1].blocks == ("scalar_mul",) and seen[-1].events == 1
print("python path ok")
"""


def test_rxcuda_native_0_keeps_the_python_path():
    """A process started with RXCUDA_NATIVE=0 builds nothing and takes the Python path end to end: Parameter's
    setter, the pending plan and the drain."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, **{_native.ENV: "0"})
    done = subprocess.run([sys.executable, "-c", _PYTHON_PATH_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "python path ok" in done.stdout


def test_an_install_without_the_compiled_module_says_so_once_and_keeps_the_python_path(monkeypatch, caplog):
    """The extension is optional (setup.py): built without a compiler, the module is missing, and rxcuda says so
    once, with the fix, and takes the Python path."""
    monkeypatch.setattr(_native, "MODULE", "rxcuda.cuda._hotpath_not_built")
    monkeypatch.delenv(_native.ENV, raising=False)  # (a run with RXCUDA_NATIVE=0 asks for the Python path itself)
    _native.reset()
    try:
        with caplog.at_level(logging.WARNING, logger="rxcuda"):
            assert _native.hotpath() is None and _native.hotpath() is None
        said = [r.getMessage() for r in caplog.records if "compiled parameter path" in r.getMessage()]
        assert len(said) == 1 and "_hotpath_not_built" in said[0] and "python3-dev" in said[0]
        assert "ModuleNotFoundError" in _native.why_not
    finally:
        monkeypatch.undo()
        _native.reset()


_COMPILES_NOTHING_SCRIPT = """
import json
import os
import shutil
import subprocess
import sys

started = subprocess.Popen.__init__

def no_compiler(self, args, *rest, **kwargs):  # (ctypes may still ask ldconfig where a library is)
    program = os.path.basename(str(args[0] if isinstance(args, (list, tuple)) else str(args).split()[0]))
    if program in ("cc", "c++", "g++") or program.endswith("gcc") or program.startswith("clang"):
        raise AssertionError(f"a compiler was started: {args!r}")
    started(self, args, *rest, **kwargs)

subprocess.Popen.__init__ = no_compiler
import numpy as np
import rxcuda
from rxcuda.cuda import NullDriver, _native

value = float(sys.argv[1])
with rxcuda.Engine(driver=NullDriver()) as engine:
    blk = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=64, scale=1.0))
    engine.write(blk["x"], np.ones(64, np.float32))
    engine.tick()
    blk.params["scale"].value = value
    assert engine.tick().tiers == ("parameters",)
    words = engine._rt.graph.nodes[0].storage.words  # (x, out, scale, n): the scale in the third word's low half
    module = _native.hotpath()
    print(json.dumps({"native": engine._updater.native is not None, "file": module and module.__file__,
                      "why_not": _native.why_not, "base": rxcuda.Parameter.__mro__[1].__name__,
                      "scale": float(words.view(np.float32)[4]), "rxcuda": rxcuda.__file__,
                      "cc": [c for c in ("cc", "gcc", "clang") if shutil.which(c)]}))
"""


def _run_compiling_nothing(env: dict | None = None, cwd=None) -> tuple[dict, float]:
    """_COMPILES_NOTHING_SCRIPT in a new process (no compiler may start in it): what it saw, and the value it set."""
    import json
    import os
    import subprocess
    import sys

    value = float(np.float32(np.random.default_rng().uniform(-8, 8)))
    env = {k: v for k, v in (env if env is not None else os.environ).items() if k != _native.ENV}
    done = subprocess.run([sys.executable, "-c", _COMPILES_NOTHING_SCRIPT, repr(value)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), value


def _checkout_copy(tmp_path, module: bool):
    """This checkout's rxcuda (with its compiled module where ``module``, else without any) and kernels/, copied
    into ``tmp_path``: a checkout used from PYTHONPATH."""
    import shutil
    from pathlib import Path

    root = Path(_native.__file__).resolve().parents[2]
    skip = ["__pycache__"] + ([] if module else ["*.so", "*.pyd"])
    shutil.copytree(root / "rxcuda", tmp_path / "rxcuda", ignore=shutil.ignore_patterns(*skip))
    shutil.copytree(root / "kernels", tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@needs_native
def test_importing_rxcuda_compiles_nothing_and_loads_the_module_built_with_the_package():
    """The compiled path is an extension module built with the package (pip install ., pip install -e .): an
    engine's first parameter change starts no compiler, and the module loaded is the one beside _hotpath.c."""
    import importlib.machinery
    from pathlib import Path

    seen, value = _run_compiling_nothing()
    assert seen["native"] is True and seen["base"] == "ParamBase" and seen["scale"] == value
    where = Path(seen["file"])
    assert where.parent == Path(_native.__file__).parent
    assert any(where.name == "_hotpath" + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def test_a_checkout_with_no_built_module_and_no_compiler_takes_the_python_path_and_starts_no_compiler(tmp_path):
    """A checkout used from PYTHONPATH where the module was never built, on a machine with no C compiler on PATH:
    rxcuda imports, says why the compiled path is missing, and sets parameters on the Python path; nothing tries to
    compile _hotpath.c (as rxcuda once did with cc at the first import)."""
    import os

    tree = _checkout_copy(tmp_path / "tree", module=False)
    bare = tmp_path / "bin"  # PATH: a folder with no compiler in it
    bare.mkdir()
    env = dict(os.environ, PYTHONPATH=str(tree), PATH=str(bare))
    seen, value = _run_compiling_nothing(env, cwd=tmp_path)
    assert seen["rxcuda"] == str(tree / "rxcuda" / "__init__.py") and seen["cc"] == []
    assert seen["native"] is False and seen["file"] is None and seen["base"] == "_Fields"
    assert "No module named 'rxcuda.cuda._hotpath'" in seen["why_not"]
    assert seen["scale"] == value  # the value reached the kernel's argument on the Python path
    assert not list((tree / "rxcuda" / "cuda").glob("_hotpath*.so")), "something built the module"


@needs_native
def test_a_module_built_from_another_source_is_not_used(tmp_path):
    """A checkout whose _hotpath.c changed since its module was built in place (a pull without pip install -e .)
    takes the Python path and says why, instead of running the old C against the new Python."""
    import os

    tree = _checkout_copy(tmp_path / "tree", module=True)
    source = tree / "rxcuda" / "cuda" / "_hotpath.c"
    source.write_text(source.read_text() + "/* changed since the build */\n")
    seen, value = _run_compiling_nothing(dict(os.environ, PYTHONPATH=str(tree)), cwd=tmp_path)
    assert seen["rxcuda"] == str(tree / "rxcuda" / "__init__.py")
    assert seen["native"] is False and seen["base"] == "_Fields" and seen["scale"] == value
    assert "was built from another _hotpath.c" in seen["why_not"] and "build it again" in seen["why_not"]


def test_stale_compares_the_modules_source_digest_with_the_source_beside_it(tmp_path):
    """_native.stale: "" for the digest of the _hotpath.c beside the module, or where none lies beside it (an
    installed wheel); the reason otherwise, a module without a digest (built before modules carried one) included."""
    import hashlib
    from types import SimpleNamespace

    module = SimpleNamespace(__file__=str(tmp_path / "_hotpath.cpython-311-x86_64-linux-gnu.so"))
    assert _native.stale(module) == ""  # no source beside it
    source = tmp_path / "_hotpath.c"
    source.write_bytes(b"/* one */\n")
    module.SOURCE = hashlib.sha256(b"/* one */\n").hexdigest()
    assert _native.stale(module) == ""
    source.write_bytes(b"/* two */\n")
    assert "was built from another _hotpath.c than the one beside it" in _native.stale(module)
    del module.SOURCE
    assert "was built from an older _hotpath.c" in _native.stale(module)

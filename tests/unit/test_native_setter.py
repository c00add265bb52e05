"""The setter's side of the compiled parameter path (rxcuda/cuda/_hotpath.c): ``ParamBase``, the fields and ``value``
setter of rxcuda.blocks.Parameter, and ``PendingBase``, the hot fields and ``set_value`` of the engine's pending plan
(rxcuda.engine._runtime.pending_plan). Each does what its Python twin does (``_Fields``, ``PendingPlan.set_value``):
the same values kept, the same errors, the same events to the same observers, the lock honoured; and the drain
publishes an AppliedUpdate as the Python drain does."""

import threading
from pathlib import Path

import numpy as np
import pytest
from _folding import while_a_producer_folds

from rxcuda.blocks._params import Parameter, _Fields
from rxcuda.cuda import _native
from rxcuda.engine._records import AppliedUpdate, applied_update
from rxcuda.engine._runtime import pending_plan
from rxcuda.model._events import ParameterChanged
from rxcuda.streams._coalesce import PendingPlan

native = _native.hotpath()
pytestmark = pytest.mark.skipif(native is None, reason=f"the compiled path was not built here: {_native.why_not} "
                                                        "(install a C compiler and the Python headers)")


class _Block:
    """What a parameter reads of its block: its name (in messages), its id and its sink."""

    def __init__(self, sink=None, id=7, name="blk"):
        self._sink, self.id, self.name = sink, id, name


def _pair(dtype, value, sink_c=None, sink_py=None, **declared):
    """The same parameter twice: on the compiled base (Parameter) and on the Python one (_Fields)."""

    class PyParameter(_Fields):
        __slots__ = ()
        __init__ = Parameter.__init__

    return (Parameter(_Block(sink_c), "p", dtype, value, **declared),
            PyParameter(_Block(sink_py), "p", dtype, value, **declared))


def _outcome(param, value):
    try:
        param.value = value
    except Exception as e:
        return type(e).__name__, str(e).replace("PyParameter", "Parameter"), param.value
    return "ok", param.value, type(param.value)


def test_parameter_is_built_on_the_compiled_base_here():
    base, pending_base = Parameter.__mro__[1], type(pending_plan()).__mro__[1]
    assert base.__module__ == pending_base.__module__ == "rxcuda.cuda._hotpath"
    assert (base.__name__, pending_base.__name__) == ("ParamBase", "PendingBase")
    assert type(pending_plan()).__mro__[2] is PendingPlan


def test_the_compiled_bases_carry_the_names_their_python_classes_hand_over():
    """rxcuda/cuda/_hotpath.c names no field of Parameter or PendingPlan: each base is made with the names of the
    class it serves (_Fields.__slots__, PendingPlan.HOT_FIELDS), so each field is the same attribute on both paths."""
    from rxcuda.blocks._params import _SETTER

    base = Parameter.__mro__[1]
    for name in (*_Fields.__slots__, "value"):
        assert name in base.__dict__, name
    pending_base = type(pending_plan()).__mro__[1]
    for name in PendingPlan.HOT_FIELDS:
        assert name in pending_base.__dict__, name
    # made once: the same names give the same type, others are refused
    assert native.param_base(_Fields.__slots__, _SETTER) is base
    assert native.pending_base(PendingPlan.HOT_FIELDS, PendingPlan.HOT_NAMES) is pending_base
    with pytest.raises(ValueError, match="made with the names"):
        native.param_base(tuple(f"x{n}" for n in _Fields.__slots__), _SETTER)
    with pytest.raises(TypeError, match="a tuple of 7 names"):
        native.pending_base(PendingPlan.HOT_FIELDS[:3], PendingPlan.HOT_NAMES)
    source = (Path(native.__file__).parent / "_hotpath.c").read_text()
    for name in (*_Fields.__slots__, *PendingPlan.HOT_FIELDS, *PendingPlan.HOT_NAMES, *_SETTER):
        if name.startswith("_"):
            assert f'"{name}"' not in source, f"_hotpath.c names {name}"


@pytest.mark.parametrize("dtype", ["f32", "f64", "f16", "i32", "u8", "i64"])
def test_the_compiled_setter_keeps_and_refuses_what_the_python_one_does(dtype):
    rng = np.random.default_rng()
    values = [float(rng.standard_normal() * 100), int(rng.integers(-300, 300)), np.float32(rng.standard_normal()),
              np.int16(rng.integers(-100, 100)), True, "2.5", None, float("nan"), float("inf"), 1e300, 2**70, -1,
              255, 256, float(rng.uniform(-1, 1)), np.float64(rng.standard_normal() * 100), np.float64("nan"),
              np.float64("-inf"), np.float64(1e300), np.float64(-3.0)]
    c, py = _pair(dtype, 1)
    for v in values:
        assert _outcome(c, v) == _outcome(py, v), (dtype, v)


def test_a_numpy_float64_is_kept_as_the_python_float_the_check_gives_and_folded_as_one():
    """numpy.float64 takes the compiled fast test (rxcuda/cuda/_hotpath.c, set_float64): kept and folded as
    float(v), as the check makes it; outside the range, or NaN, it goes through the check and is refused."""
    rng = np.random.default_rng()
    sink = pending_plan()
    c, py = _pair("f32", 0.5, sink_c=sink, min=-10.0, max=10.0)
    for _ in range(20):
        v = np.float64(rng.uniform(-10, 10))
        c.value = v
        assert type(c.value) is float and c.value == float(v) and _outcome(c, v) == _outcome(py, v)
        assert type(sink._params[(7, "p")]) is float and sink._params[(7, "p")] == float(v)
    for v in (np.float64(10.5), np.float64("nan"), np.float64(-11)):
        assert _outcome(c, v) == _outcome(py, v) and _outcome(c, v)[0] == "ValueError", v


def test_the_compiled_setter_checks_a_declared_range_and_a_range_of_ints_for_a_float():
    c, py = _pair("f32", 0.5, min=0, max=1)  # int bounds of a float parameter: not the all-float fast test
    for v in (0.25, 1, 0, 1.0000001, -0.5, 2, np.float64(0.75)):
        assert _outcome(c, v) == _outcome(py, v), v


def test_the_compiled_setter_folds_into_a_compiled_pending_plan_with_the_blocks_id():
    pending = pending_plan()
    block = _Block(pending, id=41)
    p = Parameter(block, "gain", "f32", 1.0)
    p.value = 2.5
    block.id = 42  # (engine.replace hands a block's id over: the key is made at each set)
    p.value = 3.5
    assert pending.count == 2 and pending._params == {(41, "gain"): 2.5, (42, "gain"): 3.5}
    block._sink = None
    p.value = 4.5  # out of an engine: kept, folded nowhere
    assert p.value == 4.5 and pending.count == 2


def test_the_compiled_setter_calls_any_other_sinks_set_value():
    seen = []

    class Sink:
        def set_value(self, key, value):
            seen.append((key, value))

    p = Parameter(_Block(Sink()), "gain", "i32", 1)
    p.value = 5
    p.value = np.int64(6)  # converted by the full check first
    assert seen == [((7, "gain"), 5), ((7, "gain"), 6)] and type(seen[1][1]) is int


def test_a_refused_value_is_neither_kept_nor_folded():
    pending = pending_plan()
    p = Parameter(_Block(pending), "gain", "f32", 1.0)
    with pytest.raises(TypeError, match=r"blk\.p|blk\.gain"):
        p.value = "loud"
    assert p.value == 1.0 and pending.count == 0 and pending._params == {}
    with pytest.raises(AttributeError):
        del p.value


def _both_pendings():
    return pending_plan(), PendingPlan()


def test_set_value_publishes_the_same_events_to_the_same_observers_in_c_and_in_python():
    out = []
    for pending in _both_pendings():
        seen = []
        subs = [pending.changes.subscribe(lambda e, seen=seen: seen.append(("changes", e))),
                pending.of_type(ParameterChanged).subscribe(lambda e, seen=seen: seen.append(("values", e)))]
        pending.set_value((3, "a"), 1.5)
        subs[0].dispose()
        pending.set_value((3, "b"), 2)
        subs[1].dispose()
        pending.set_value((3, "c"), 3)
        assert pending._observed == ()
        out.append((seen, dict(pending._params), pending.count))
    assert out[0] == out[1]
    seen = out[0][0]
    assert seen[0] == ("changes", ParameterChanged(3, "a", 1.5)) and type(seen[0][1]) is ParameterChanged
    assert [k for k, _ in seen] == ["changes", "values", "values"]


def test_a_failing_observer_goes_to_the_pending_plans_error_handler_and_the_value_is_kept():
    for make in (lambda on_error: pending_plan(on_error), PendingPlan):
        failures, seen = [], []
        pending = make(lambda err, event, failures=failures: failures.append((str(err), event)))

        def boom(e):
            raise ValueError("subscriber broke")

        pending.changes.subscribe(boom)
        pending.changes.subscribe(seen.append)
        pending.set_value((1, "x"), 9.0)
        assert failures == [("subscriber broke", ParameterChanged(1, "x", 9.0))]
        assert seen == [ParameterChanged(1, "x", 9.0)] and pending._params == {(1, "x"): 9.0}


def test_without_an_error_handler_a_failing_observer_reaches_the_producer():
    pending = pending_plan()
    pending.changes.subscribe(lambda e: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        pending.set_value((1, "x"), 1.0)
    assert pending._params == {(1, "x"): 1.0} and pending.count == 1  # folded first: never lost


def test_set_value_waits_for_a_producer_inside_its_section():
    pending = pending_plan()
    while_a_producer_folds(pending, lambda: pending.set_value((1, "a"), 1.0))
    assert pending.count == 2 and pending._params == {(2, "b"): 2.0, (1, "a"): 1.0}
    assert not pending._lock.locked()


def test_many_threads_setting_lose_no_count():
    pending = pending_plan()
    params = [Parameter(_Block(pending, id=i), "v", "f64", 0.0) for i in range(4)]

    def hammer(p):
        for i in range(2000):
            p.value = float(i)

    threads = [threading.Thread(target=hammer, args=(p,)) for p in params]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pending.count == 8000 and pending._params == {(i, "v"): 1999.0 for i in range(4)}


@pytest.mark.parametrize("failing", [False, True])
def test_the_compiled_drain_publishes_the_applied_update_as_the_python_drain_does(failing):
    from rxcuda.engine._update import _drain_one
    from rxcuda.streams._broadcast import Broadcast

    out = []
    for drain in (native.drain_one, _drain_one):
        failures, seen = [], []
        updates = Broadcast(on_error=lambda err, item, failures=failures: failures.append(str(err)))
        if failing:
            updates.observable.subscribe(lambda u: 1 / 0)
        updates.observable.subscribe(seen.append)
        pending = pending_plan()
        pending.set_value((1, "scale"), 2.0)
        table = {(1, "scale"): (lambda v: True, ("mul",))}
        got = drain(pending, table,
                    (updates.observers, applied_update, 5, ("parameters",), updates))
        assert got == (("mul",), None, 1)
        (record,) = seen
        assert type(record) is AppliedUpdate and 0 <= record.seconds < 1
        out.append((record._replace(seconds=0), failures))
    assert out[0] == out[1]
    assert out[0][0] == AppliedUpdate(5, ("parameters",), ("mul",), 0, 1)
    assert out[0][1] == (["division by zero"] if failing else [])


def test_the_one_maker_of_an_applied_update_is_the_compiled_record_here():
    """rxcuda.engine._records.applied_update is the compiled ``Record(AppliedUpdate)``, which the compiled drain fills
    in without a Python call; it makes what tuple.__new__ makes, and a drain handed another maker calls it."""
    import functools

    from rxcuda.streams._broadcast import Broadcast

    assert type(applied_update) is native.Record
    fields = (5, ("parameters",), ("mul",), 0.5, 1)
    made = applied_update(fields)
    assert type(made) is AppliedUpdate and made == tuple.__new__(AppliedUpdate, fields) and made.seconds == 0.5
    with pytest.raises(TypeError, match="a tuple of 5 fields"):
        applied_update(fields[:4])
    with pytest.raises(TypeError, match="named tuple type"):
        native.Record(int)
    seen: list = []
    updates = Broadcast()
    updates.observable.subscribe(seen.append)
    pending = pending_plan()
    pending.set_value((1, "scale"), 2.0)
    other = functools.partial(tuple.__new__, AppliedUpdate)
    native.drain_one(pending, {(1, "scale"): (lambda v: True, ("mul",))}, (updates.observers, other, 5,
                                                                          ("parameters",), updates))
    (record,) = seen
    assert type(record) is AppliedUpdate and record._replace(seconds=0) == AppliedUpdate(5, ("parameters",), ("mul",),
                                                                                           0, 1)


def test_the_compiled_drain_publishes_nothing_for_a_value_it_did_not_apply():
    seen = []
    from rxcuda.streams._broadcast import Broadcast

    updates = Broadcast()
    updates.observable.subscribe(seen.append)
    pending = pending_plan()
    pending.set_value((1, "scale"), 2.0)
    got = native.drain_one(pending, {(1, "scale"): (None, ("mul",))},
                           (updates.observers, applied_update, 5, ("parameters",), updates))
    assert got == (None, {(1, "scale"): 2.0}, 1) and seen == []
    with pytest.raises(TypeError, match="drain_one"):
        native.drain_one(pending, {}, ("not", "five"))


_OTHER_NAMES_SCRIPT = """
import importlib.util
import sys
import threading

spec = importlib.util.spec_from_file_location("_hotpath", sys.argv[1])  # the module alone: no rxcuda imported
hp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hp)
assert "rxcuda" not in sys.modules

fields = ("nm", "dt", "val_", "owner_", "conv_", "mn", "mx", "st", "exact_", "low_", "high_")
Param = hp.param_base(fields, ("v", "target_", "key_", "take"))
Pending = hp.pending_base(("mutex_", "vals_", "n_", "m_", "ever_", "watchers_", "kind_"), ("say_", "bcast_"))
for name in (*fields, "v"):
    assert name in Param.__dict__, name

class Owner:
    def __init__(self, target):
        self.target_, self.key_ = target, 41

class Other:  # any other sink: its fold method is the one named
    def __init__(self):
        self.seen = []

    def take(self, key, value):
        self.seen.append((key, value))

pending = Pending()
pending.mutex_, pending.vals_, pending.watchers_, pending.n_, pending.ever_ = threading.Lock(), {}, (), 0, 0
p, q = Param(), Param()
other = Other()
for param, sink in ((p, pending), (q, other)):
    param.nm, param.owner_, param.exact_, param.low_, param.high_ = "gain", Owner(sink), float, 0.0, 10.0
    param.conv_ = lambda v: float(v) * 2  # (the full check: what the fast test does not pass)
p.v = 2.5
p.v = 11  # not exactly a float: through the check
q.v = 3.5
assert (p.v, p.val_, q.v) == (22.0, 22.0, 3.5)
assert pending.vals_ == {(41, "gain"): 22.0} and (pending.n_, pending.ever_) == (2, 2)
assert other.seen == [((41, "gain"), 3.5)]
out = hp.drain_one(pending, {(41, "gain"): (lambda v: v == 22.0, ("gain's block",))})
assert out == (("gain's block",), None, 2) and pending.n_ == 0 and pending.vals_ == {}
print("other names ok")
"""


def test_the_compiled_steps_take_every_name_from_the_classes_that_hand_them_over():
    """The contract is the names: made with other names than Parameter's and PendingPlan's (in a process where
    rxcuda's classes did not make them first), the compiled setter, fold and drain work on those names alone."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _OTHER_NAMES_SCRIPT, native.__file__], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "other names ok" in done.stdout

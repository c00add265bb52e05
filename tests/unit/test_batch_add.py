"""The compiled batch add of a build's kernel nodes (``add_kernel_nodes`` in rxcuda/cuda/_hotpath.c, used by
``FastDriver.add_kernel_nodes`` on the real driver): driven here with a C-callable stand-in for
cuGraphAddKernelNode_v2 that records what it is given, so the loop's dependencies, struct addresses, handles and
failures are checked without a GPU (tests/gpu/test_replan_gpu.py reads a real template back). And the structs
``ArgStorage.fill`` writes, against those cuda.bindings writes field by field, and the arguments it writes a kind
at a time."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from test_native import native, needs_native

from rxcuda.cuda import _driver
from rxcuda.cuda.nodes._base import BuildContext
from rxcuda.cuda.nodes._kernel import STRIDE, ArgStorage, KernelNode, _layout
from rxcuda.model._describe import Launch
from rxcuda.model._graphplan import BufferArg, KernelNodePlan, ScalarArg

ADD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p)
GRAPH = 0xABC000


class Adder:
    """Records (graph, dependency handles, params address) per call and hands out handles 0x1000, 0x1001, ...;
    returns ``fail_with`` for the call numbered ``fail_at``."""

    def __init__(self, fail_at: int = -1, fail_with: int = 0):
        self.calls: list = []
        self.fail_at, self.fail_with = fail_at, fail_with
        self.fn = ADD(self._call)
        self.address = ctypes.cast(self.fn, ctypes.c_void_p).value

    def _call(self, out, graph, deps, n, params):
        if len(self.calls) == self.fail_at:
            self.calls.append(None)
            return self.fail_with
        self.calls.append((graph, [deps[k] for k in range(n)], params))
        out[0] = 0x1000 + len(self.calls) - 1
        return 0


def _run(adder: Adder, deps: list[tuple[int, ...]]):
    n = len(deps)
    params = np.arange(n, dtype=np.uint64) * np.uint64(STRIDE) + np.uint64(0x7F0000)
    counts = np.array([len(d) for d in deps], dtype=np.int64)
    flat = np.array([i for d in deps for i in d] or [0], dtype=np.int64)
    out = np.zeros(max(n, 1), dtype=np.uint64)
    result = native.add_kernel_nodes(adder.address, GRAPH, params.ctypes.data, counts.ctypes.data, flat.ctypes.data,
                                     out.ctypes.data, n)
    return result, params, out


@needs_native
def test_each_node_is_added_after_the_handles_of_its_dependencies_with_its_own_struct():
    rng = np.random.default_rng()
    deps = [()]
    for i in range(1, 80):
        k = int(rng.integers(0, min(i, 6) + 1))
        deps.append(tuple(sorted(rng.choice(i, size=k, replace=False).tolist())))
    deps.append(tuple(range(45)))  # more than the loop's 32 places on the stack
    adder = Adder()
    (failed, err), params, out = _run(adder, deps)
    assert (failed, err) == (-1, 0)
    assert out.tolist() == [0x1000 + i for i in range(len(deps))]
    for i, (graph, handles, p) in enumerate(adder.calls):
        assert graph == GRAPH and p == int(params[i])
        assert handles == [0x1000 + d for d in deps[i]]


@needs_native
def test_the_first_refusal_stops_the_loop_and_names_its_node():
    adder = Adder(fail_at=5, fail_with=700)
    (failed, err), _, out = _run(adder, [()] + [(i,) for i in range(9)])
    assert (failed, err) == (5, 700) and len(adder.calls) == 6
    assert out[6:].tolist() == [0] * 4


@needs_native
@pytest.mark.parametrize("bad", [3, -1, 7])
def test_a_dependency_that_names_no_earlier_node_stops_before_the_driver_call(bad):
    adder = Adder()
    (failed, err), _, _ = _run(adder, [(), (0,), (1,), (bad,), (3,)])
    assert (failed, err) == (3, -1) and len(adder.calls) == 3


def test_fill_writes_what_cuda_bindings_writes_field_by_field():
    assert _layout() is not None, "CUDA_KERNEL_NODE_PARAMS's fields were not found in cuda.bindings' struct"
    rng = np.random.default_rng()
    plans = []
    for i in range(12):
        grid = tuple(int(x) for x in rng.integers(1, 1 << 16, 3))
        block = (int(rng.integers(1, 33)), int(rng.integers(1, 9)), int(rng.integers(1, 5)))  # <= 1024 threads
        args = () if i % 5 == 4 else (BufferArg(i), ScalarArg(i, "s", "f32", 4, float(rng.standard_normal())))
        plans.append(KernelNodePlan(i, i, "k", f"code{i % 3}", Launch(grid, block, int(rng.integers(0, 1 << 15))),
                                    args, frozenset(), frozenset(), f"b{i}/k"))
    functions = {f"code{j}": _driver.drv.CUfunction(int(rng.integers(1, 1 << 62))) for j in range(3)}
    pointers = {i: int(rng.integers(1 << 20, 1 << 48)) * 256 for i in range(12)}
    storage = ArgStorage(plans)
    storage.fill(functions, pointers)
    for n in plans:
        want = _driver.drv.CUDA_KERNEL_NODE_PARAMS()
        want.func = functions[n.code_key]
        want.gridDimX, want.gridDimY, want.gridDimZ = n.launch.grid
        want.blockDimX, want.blockDimY, want.blockDimZ = n.launch.block
        want.sharedMemBytes = n.launch.shared_mem
        want.kernelParams = storage.ptrs_base + 8 * storage.starts[n.id][0] if n.args else 0
        have = ctypes.string_at(storage.structs_base + STRIDE * storage.row[n.id], 48)  # (func .. kernelParams)
        assert have == ctypes.string_at(want.getPtr(), 48), n.label
        for a, (view, idx) in zip(n.args, storage.slots_of(n), strict=True):  # the arguments, as the driver reads them
            got = view[idx].item()
            assert got == (pointers[a.buffer] if isinstance(a, BufferArg) else np.float32(a.value)), n.label


def test_fill_after_a_previous_storage_and_with_one_launch_shared_writes_as_a_fresh_fill():
    """The structs of a storage that took its leading nodes' layout over from the previous one (a re-plan), with
    one Launch object shared by many nodes (the blocks of one kernel), are those of a storage made afresh."""
    assert _layout() is not None
    rng = np.random.default_rng()
    shared = Launch((4, 1, 1), (256, 1, 1), 0)
    plans = []
    for i in range(40):
        launch = shared if i % 4 else Launch((int(rng.integers(1, 99)), 1, 1), (128, 2, 1), 16 * i)
        args = () if i % 9 == 8 else (BufferArg(i), ScalarArg(i, "n", "i32", 4, int(rng.integers(0, 1 << 20))))
        plans.append(KernelNodePlan(i, i, "k", f"code{i % 2}", launch, args, frozenset(), frozenset(), f"b{i}/k"))
    functions = {f"code{j}": _driver.drv.CUfunction(int(rng.integers(1, 1 << 62))) for j in range(2)}
    pointers = {i: int(rng.integers(1 << 20, 1 << 48)) * 256 for i in range(40)}
    before = ArgStorage(plans[:25])
    before.fill(functions, pointers)
    before.seal()
    after = ArgStorage(plans, previous=before)
    after.fill(functions, pointers)
    fresh = ArgStorage(plans)
    fresh.fill(functions, pointers)
    assert after.same == 25
    for n in plans:
        got = ctypes.string_at(after.structs_base + STRIDE * after.row[n.id], 48)
        want = bytearray(ctypes.string_at(fresh.structs_base + STRIDE * fresh.row[n.id], 48))
        if n.args:  # (the pointer into each storage's own pointer array)
            assert after.starts[n.id][0] == fresh.starts[n.id][0]
            at = _layout().fields["args"][1]
            want[at:at + 8] = (after.ptrs_base + 8 * after.starts[n.id][0]).to_bytes(8, "little")
        assert got == bytes(want), n.label


def test_make_all_gives_the_nodes_make_gives_on_a_cold_build():
    """A cold build's kernel nodes, made in one loop (KernelNode.make_all), hold what make() gives each."""
    rng = np.random.default_rng()
    launch = Launch((4, 1, 1), (256, 1, 1), 0)
    plans = [KernelNodePlan(i, i, "k", "code", launch, (BufferArg(i), ScalarArg(i, "s", "f32", 4, float(i))),
                            frozenset({i}), frozenset({i + 1}), f"b{i}/k") for i in range(16)]
    functions = {"code": _driver.drv.CUfunction(int(rng.integers(1, 1 << 62)))}
    pointers = {i: int(rng.integers(1 << 20, 1 << 48)) * 256 for i in range(16)}
    b = BuildContext(None, None, None, functions, pointers)
    KernelNode.prepare(plans, b)
    fast, one_by_one = KernelNode.make_all(plans, b), [KernelNode.make(p, b) for p in plans]
    fields = [f for f in KernelNode.__slots__ if f not in ("_params",)] + ["plan"]
    for x, y in zip(fast, one_by_one, strict=True):
        assert {f: getattr(x, f) for f in fields} == {f: getattr(y, f) for f in fields}
        assert x.handle is None and x.slots == y.slots and x.buffer_args == y.buffer_args == {x.plan.id: [0]}
        assert ctypes.string_at(x.params_ptr, 48) == ctypes.string_at(x.params.getPtr(), 48)

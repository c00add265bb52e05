"""Device propagation in rxcuda.tensor (issue 13): user-made cpu/cuda mixes are a DeviceError; an op that runs
on one backend only (``_ops.BACKENDS``) pulls its operands onto that backend when its node is made, and
``explain()`` shows each pulled node and copy. Planning only: nothing here runs on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda.tensor as rt
from rxcuda.tensor import _ops

OP = "test_cuda_only"


@pytest.fixture
def cuda_only_op():
    _ops.BACKENDS[OP] = frozenset({"cuda"})
    yield lambda *ts: rt.Tensor(_ops.op_node(OP, tuple(t.node for t in ts), (), ts[0].shape, ts[0].dtype))
    del _ops.BACKENDS[OP]


def _cpu(shape=(2, 3)):
    return rt.tensor(np.ones(shape, np.float32))


def test_user_mixes_are_still_a_device_error():
    a, b = _cpu(), _cpu().to("cuda")
    with pytest.raises(rt.DeviceError, match=r"different devices.*\.to\('cpu'\)"):
        a + b
    with pytest.raises(rt.DeviceError, match="different devices"):
        rt.matmul(a, b.T)


def test_ops_run_everywhere_unless_the_table_says_otherwise(cuda_only_op):
    assert _ops.backends("add") == frozenset({"cpu", "cuda"})
    assert _ops.backends(OP) == frozenset({"cuda"})


def test_a_cuda_only_op_pulls_its_operand_chain_back_to_the_data(cuda_only_op):
    x = _cpu()
    h = rt.exp(x * 2.0) + 1.0
    y = cuda_only_op(h)
    assert y.device == "cuda" and h.device == "cpu"  # the user's tensor is untouched
    text = rt.explain(y)
    nodes = text.split("\nnodes:\n")[1].split("launches:")[0]
    # the elementwise chain was rebuilt on cuda: only the data crosses, once; the fills are made on the device
    assert [ln.split()[1] for ln in nodes.strip("\n").splitlines()] == ["const", "copy", "full", "mul", "exp", "full",
                                                                    "add", OP]
    assert all(" cuda " in ln for ln in nodes.strip().splitlines()[1:])
    copies = text.split("copies:")[1].strip().splitlines()
    assert len(copies) == 1 and "cpu -> cuda" in copies[0] and f"pulled: {OP} runs on cuda only" in copies[0]
    assert "device pulls: 6 node(s)" in text
    assert "(pulled by test_cuda_only)" in text
    assert "launches:" in text and "elementwise on cuda" in text  # the rebuilt chain still fuses


def test_a_pull_cancels_a_to_round_trip_and_mixes_are_fine_for_a_pulling_op(cuda_only_op):
    g = _cpu().to("cuda")
    back = g * 3.0
    host = back.to("cpu")
    y = cuda_only_op(host, _cpu())
    text = rt.explain(y)
    copies = text.split("copies:")[1].strip().splitlines()
    # .to('cpu') then pulled to cuda: the round trip cancels; the user's .to('cuda') stays as asked
    assert sorted(c.rsplit(" (", 1)[1] for c in copies) == sorted(["asked: .to('cuda'))",
                                                                  f"pulled: {OP} runs on cuda only)"])
    assert y.node.inputs[0] is back.node


def test_a_pull_copies_requires_grad_and_detached_tensors_instead_of_rebuilding_them(cuda_only_op):
    w = rt.tensor(np.ones(3), requires_grad=True)
    h = w * 2.0
    d = h.detach()
    y = cuda_only_op(h, d)
    (a, b) = y.node.inputs
    assert a.op == "mul" and a.device == "cuda" and a.inputs[0].op == "copy" and a.inputs[0].inputs[0] is w.node
    assert b.op == "copy" and b.inputs[0] is d.node  # still detached on the other side
    assert not rt.Tensor(b).requires_grad and rt.Tensor(a).requires_grad


def test_no_pull_for_ops_on_a_backend_that_runs_them(cuda_only_op):
    x = _cpu().to("cuda")
    y = cuda_only_op(x * 2.0)
    assert all(n not in _ops.PULLED for n in (y.node, *y.node.inputs))
    assert "device pulls" not in rt.explain(y)
    assert "pulled" not in rt.explain(rt.exp(_cpu()))

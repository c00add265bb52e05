"""Workers sharing one GPU without MPS (rxcuda/distributed/_sharing.py): which GPUs are shared, the advice said once
per GPU, and what a worker's build answer records; the GPU's UUID and MPS state on the null driver."""

from __future__ import annotations

from rxcuda.cuda import NullDriver
from rxcuda.cuda._device import Device
from rxcuda.distributed import _sharing


def at(node, gpu, mps):
    return {"node": node, "pid": 1, "gpus": ["0"], "gpu": gpu, "mps": mps}


def test_a_gpu_two_workers_share_without_mps_is_found():
    where = {"a": at("n1", "g1", False), "b": at("n1", "g1", False), "c": at("n1", "g2", False),
             "d": at("n2", "g1", False)}
    assert _sharing.shared_without_mps(where) == [("n1", "g1", ("a", "b"))]


def test_mps_on_for_all_sharers_or_an_unknown_gpu_is_not_reported():
    assert _sharing.shared_without_mps({"a": at("n", "g", True), "b": at("n", "g", True)}) == []
    assert _sharing.shared_without_mps({"a": at("n", "g", True), "b": at("n", "g", False)}) == [("n", "g", ("a", "b"))]
    assert _sharing.shared_without_mps({"a": at("n", None, False), "b": at("n", None, False)}) == []


def test_the_advice_is_given_once_per_gpu_and_names_the_workers_and_the_fix():
    where = {"a": {"node": "n1", "pid": 1, "gpus": ["0"]}, "b": {"node": "n1", "pid": 2, "gpus": ["0"]}}
    warned: set = set()
    assert _sharing.placed(where, warned, "a", {"gpu": "ab" * 16, "mps": False, "blocks": 1}) == []
    ((severity, advice),) = _sharing.placed(where, warned, "b", {"gpu": "ab" * 16, "mps": False, "blocks": 1})
    assert severity == "warning" and "Pass share_gpu='auto'" in advice and "ends the others on that GPU too" in advice
    assert "workers 'a', 'b' share one GPU (abababab… on node n1)" in advice
    assert "nvidia-cuda-mps-control -d" in advice and "a GPU of its own" in advice
    assert where["b"]["gpu"] == "ab" * 16 and where["b"]["pid"] == 2
    assert _sharing.placed(where, warned, "b", {"gpu": "ab" * 16, "mps": False}) == []  # a rebuild: said already
    assert _sharing.placed(where, warned, "a", ["first.scale"]) == []  # a retune's answer records nothing


def test_the_null_driver_has_no_gpu_uuid_and_no_mps():
    device = Device(0, api=NullDriver())
    assert device.uuid is None and device.mps is False


def test_what_share_gpu_came_to_is_an_info_said_once_and_named_in_the_advice():
    from rxcuda.distributed import _mps

    choice = _mps.choose("auto", [("a", "b")], candidates=("a", "b"), user_pipe=None, binary=None)
    where = {"a": {"node": "n1", "gpus": ["0"]}, "b": {"node": "n1", "gpus": ["0"]}}
    warned: set = set()
    assert _sharing.placed(where, warned, "a", {"gpu": "cd" * 16, "mps": False}, choice) == [("info", str(choice))]
    ((severity, advice),) = _sharing.placed(where, warned, "b", {"gpu": "cd" * 16, "mps": False}, choice)
    assert severity == "warning" and f"({choice})" in advice and "is not on PATH" in advice
    assert _sharing.placed(where, warned, "b", {"gpu": "cd" * 16, "mps": False}, choice) == []

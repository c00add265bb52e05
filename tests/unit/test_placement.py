"""Placement and the split of a plan per device (pure): the placement's checks, peer copies and their
direction, event record/wait pairs, the launch order, delayed connections and memory reuse across devices."""

from __future__ import annotations

import numpy as np
import pytest
from _pipeline import add, builder, kcode, mul, ptr, scalar

import rxcuda
from rxcuda import Block, If, ValidationError
from rxcuda.cuda import NullDriver
from rxcuda.cuda._peer import Crossing
from rxcuda.lowlevel import (
    BlockEntry,
    Connection,
    EventRecordNodePlan,
    EventWaitNodePlan,
    KernelNodePlan,
    PeerCopyNodePlan,
    PipelineDescription,
    PortRef,
    check_placement,
    plan,
    split,
)

N = 1024
KERNELS = "kernels"
INPLACE = kcode("inplace", ptr("x", "inout"), scalar("n", default=64))


def inplace(name: str) -> Block:
    """A block that writes its input in place."""
    b = builder(name)
    k = b.add_kernel(INPLACE)
    b.input("x", k["x"])
    return b.build()


def entry(b: Block) -> BlockEntry:
    return BlockEntry(b.id, b.description, b.values(), b.launches())


def chain_desc(*blocks: Block, placement: dict, delay: bool = False) -> PipelineDescription:
    """blocks[0].out -> blocks[1].x -> ... (each block a ``mul``), the first input fed from the host."""
    conns = tuple(Connection(PortRef(a.id, "out"), PortRef(b.id, "x"), delay=int(delay))
                  for a, b in zip(blocks, blocks[1:], strict=False))
    return PipelineDescription(tuple(entry(b) for b in blocks), conns, fed=frozenset({PortRef(blocks[0].id, "x")}),
                               placement={blocks[i].id: d for i, d in placement.items()})


def kinds(gp) -> list[str]:
    return [type(n).__name__ for n in gp.nodes]


# -- placement and the split (pure) --------------------------------------------------------------------------
def test_a_placement_past_the_devices_and_an_unknown_block_are_refused():
    a = mul(name="a")
    desc = PipelineDescription((entry(a),), fed=frozenset({PortRef(a.id, "x")}), placement={a.id: 2, 999: 1})
    messages = [p.message for p in check_placement(desc, 2).problems]
    assert any("block 'a' is placed on device 2, but the engine has 2 devices (positions 0..1)" in m for m in messages)
    assert any("block id 999, which is not in the pipeline" in m for m in messages)
    with pytest.raises(ValidationError, match="placed on device 2"):
        split(plan(desc, reuse_memory=False), desc, 2)


def test_a_region_body_across_devices_is_refused_naming_both():
    fb = builder("check")
    k = fb.add_kernel(kcode("flag", ptr("x"), ptr("flag", "out", "u32"), scalar("n", default=64)))
    fb.input("x", k["x"])
    fb.output("flag", k["flag"], count=1)
    flag = fb.build()
    inner = mul(name="inner")
    e = rxcuda.Engine(devices=[0, 1], driver=NullDriver(devices=2))
    try:
        e.add(flag)
        gate = If(flag["flag"], [inner])
        e.add(gate)
        e.write(flag["x"], np.ones(64, np.float32))
        e.write(inner["x"], np.ones(64, np.float32))
        desc = e.describe()
        desc = PipelineDescription(desc.blocks, desc.connections, desc.bindings, desc.fed, desc.regions,
                                   placement={inner.id: 1})
        with pytest.raises(ValidationError, match=r"block 'inner' of the body of region 'if' is placed on device 1, "
                                                  r"region 'if' on device 0"):
            split(plan(desc, reuse_memory=False), desc, 2)
    finally:
        e.close()


def test_a_connection_between_devices_is_a_peer_copy_in_the_readers_graph_ordered_by_events():
    a, b = mul(name="a"), mul(name="b")
    desc = chain_desc(a, b, placement={1: 1})
    gp = plan(desc, reuse_memory=False)
    s = split(gp, desc, 2)
    p0, p1 = s.plans
    assert kinds(p0) == ["EventWaitNodePlan", "KernelNodePlan", "EventRecordNodePlan"]
    assert kinds(p1) == ["EventWaitNodePlan", "PeerCopyNodePlan", "EventRecordNodePlan", "KernelNodePlan"]
    copy = p1.nodes[1]
    assert isinstance(copy, PeerCopyNodePlan) and copy.src_device == 0
    assert copy.src == p0.port_buffers[PortRef(a.id, "out")]  # a's buffer on device 0 ...
    assert copy.dst == p1.port_buffers[PortRef(b.id, "x")]  # ... into b's replica on device 1
    assert copy.nbytes == 64 * 4
    # device 0 records "ready" after a's kernel; device 1 waits for it before the copy, b after the copy
    ready = p0.nodes[2]
    assert isinstance(ready, EventRecordNodePlan) and p0.deps[2] == (1,)
    assert isinstance(p1.nodes[0], EventWaitNodePlan) and p1.nodes[0].event == ready.event
    assert p1.deps[1] == (0,) and 1 in p1.deps[3]
    # ... and device 1 records "copied", which device 0 waits for before writing a.out again
    copied = p1.nodes[2]
    assert p1.deps[2] == (1,) and p0.nodes[0].event == copied.event and 0 in p0.deps[1]
    assert s.order == (0, 1) and len(s.events) == 2
    assert [str(link) for link in s.links] == ["a.out: device 0 -> 1 (256 B)"]
    assert s.nodes[gp.kernel_nodes[(b.id, "mul")]] == (1, 3)


def test_data_flowing_back_launches_the_producer_first():
    a, b = mul(name="a"), mul(name="b")
    s = split(plan(desc := chain_desc(a, b, placement={0: 1}), reuse_memory=False), desc, 2)
    assert s.order == (1, 0) and s.links[0].src_device == 1 and s.links[0].dst_device == 0


def test_copies_going_back_and_forth_between_devices_are_refused():
    a, b, c = mul(name="a"), mul(name="b"), mul(name="c")
    desc = chain_desc(a, b, c, placement={1: 1})
    with pytest.raises(ValidationError, match=r"data goes back and forth between devices: device 0 -> 1 \(a.out\), "
                                              r"device 1 -> 0 \(b.out\)"):
        split(plan(desc, reuse_memory=False), desc, 2)


def test_a_block_writing_another_devices_buffer_is_refused():
    a = mul(name="a")
    w = inplace("w")
    desc = PipelineDescription((entry(a), entry(w)), (Connection(PortRef(a.id, "out"), PortRef(w.id, "x")),),
                               fed=frozenset({PortRef(a.id, "x")}), placement={w.id: 1})
    with pytest.raises(ValidationError, match=r"w/inplace on device 1 writes a.out, which lives on device 0"):
        split(plan(desc, reuse_memory=False), desc, 2)


def test_a_reader_before_a_rewrite_on_the_other_device_is_refused():
    a, r = mul(name="a"), mul(name="r")
    w = inplace("w")
    conns = (Connection(PortRef(a.id, "out"), PortRef(r.id, "x")), Connection(PortRef(a.id, "out"), PortRef(w.id, "x")))
    desc = PipelineDescription((entry(a), entry(r), entry(w)), conns, fed=frozenset({PortRef(a.id, "x")}),
                               placement={r.id: 1})
    with pytest.raises(ValidationError, match=r"r/mul on device 1 reads a.out before w/inplace on device 0 writes "
                                              r"it again"):
        split(plan(desc, reuse_memory=False), desc, 2)


def test_a_profiled_plan_is_split_with_stamps_per_device():
    from rxcuda.lowlevel import StampNodePlan
    from rxcuda.plan._profile import add_stamps

    a, b = mul(name="a"), mul(name="b")
    desc = chain_desc(a, b, placement={1: 1})
    gp = plan(desc, reuse_memory=False)
    s = split(add_stamps(gp, desc, "block"), desc, 2)
    assert s.nodes == split(gp, desc, 2).nodes  # the whole plan's nodes go where they went unprofiled
    for p in s.plans:  # each device's plan: its own start stamp (column 0) and a stamp per unit, last
        stamps = [n for n in p.nodes if isinstance(n, StampNodePlan)]
        assert stamps[0].column == 0 and [n.column for n in stamps] == list(range(len(p.stamps.names)))
        assert p.nodes[-len(stamps):] == tuple(stamps)
    assert s.plans[0].stamps.names == ("frame", "a")
    copy = next(n for n in s.plans[1].nodes if isinstance(n, PeerCopyNodePlan))
    assert s.plans[1].stamps.names == ("frame", copy.label, "b") and s.plans[1].stamps.blocks[1] is None
    assert s.plans[1].stamps.preds[2] == (1,)  # b is timed from the end of the copy it waits for
    # a device whose plan runs nothing a stamp times gets no stamps
    one = chain_desc(a, b, placement={})
    only = split(add_stamps(plan(one, reuse_memory=False), one, "kernel"), one, 2)
    assert only.plans[1].nodes == () and only.plans[1].stamps is None


def test_a_delayed_connection_between_devices_is_copied_after_the_frames_readers():
    a, b = mul(name="a"), mul(name="b")
    desc = chain_desc(a, b, placement={1: 1}, delay=True)
    s = split(plan(desc, reuse_memory=False), desc, 2)
    p1 = s.plans[1]
    assert kinds(p1) == ["KernelNodePlan", "EventWaitNodePlan", "PeerCopyNodePlan", "EventRecordNodePlan"]
    assert 0 in p1.deps[2]  # the copy overwrites the replica b read this frame: after b
    p0 = s.plans[0]
    record = next(n for n in p0.nodes if isinstance(n, EventRecordNodePlan))
    delay_copy = next(i for i, n in enumerate(p0.nodes) if type(n).__name__ == "CopyNodePlan")
    assert delay_copy in p0.deps[record.id]  # ready once the previous-frame buffer holds this frame's value


def test_memory_reuse_stays_per_device_and_skips_what_another_device_copies():
    blocks = [mul(name=f"m{i}") for i in range(5)]
    desc = chain_desc(*blocks, placement={3: 1, 4: 1})
    gp = plan(desc, reuse_memory=True)
    s = split(gp, desc, 2)
    crossing = s.links[0].src
    for p in s.plans:
        for group in p.shared:
            assert all(m < len(p.buffers) for m in group)
    assert all(crossing not in g for g in s.plans[0].shared)


def test_a_crossing_names_a_missing_remote_buffer():
    c = Crossing(1, [], {}, {0: "peer"})
    with pytest.raises(KeyError, match="buffer 3 of device 0 has no memory yet"):
        c.pointer(0, 3)
    assert c.route(0) == "peer" and c.route(5) == "local"


def test_the_split_keeps_every_kernel_once():
    blocks = [add(name=f"a{i}") for i in range(2)]
    desc = PipelineDescription(tuple(entry(b) for b in blocks),
                               fed=frozenset(PortRef(b.id, p) for b in blocks for p in ("a", "b")),
                               placement={blocks[1].id: 1})
    s = split(plan(desc, reuse_memory=False), desc, 2)
    kernels = [n for p in s.plans for n in p.nodes if isinstance(n, KernelNodePlan)]
    assert sorted(k.label for k in kernels) == ["a0/add", "a1/add"] and s.links == ()


def test_the_planner_refuses_a_library_call_on_another_gpu_but_not_on_the_same_one():
    from rxcuda import BlockBuilder, CallSpec, KernelParam

    params = (KernelParam("x", "pointer", 8, "f32", "in"), KernelParam("y", "pointer", 8, "f32", "out"))
    b = BlockBuilder("gemm")
    k = b.add_call(CallSpec(name="copy", params=params, record=lambda args: None))
    b.input("x", k["x"], count=64)
    b.output("y", k["y"], count=64)
    call = b.build()
    desc = PipelineDescription((entry(call),), fed=frozenset({PortRef(call.id, "x")}), placement={call.id: 1})
    problems = check_placement(desc, 2, ordinals=(0, 3)).problems
    assert [p.message for p in problems] == [
        "block 'gemm' is a library call placed on device 1 (GPU 3), but its library handle lives on device 0 "
        "(GPU 0), where library calls are captured; place it on device 0"]
    assert check_placement(desc, 2, ordinals=(0, 0)).problems == []  # one GPU twice: the same handles
    assert split(plan(desc, reuse_memory=False), desc, 2, (0, 0)).plans[1].nodes

"""Memory reuse by liveness: which buffers share an allocation (the pure pass), what the engine allocates
for them and reports (``engine.stats``), and what it does when the user reads a port that shared memory.

Every plan that shares is also checked against a slow, independent rule: within a group, every node using
an earlier member is a strict ancestor (in the dependency DAG, region bodies seen as their region node) of
every node using a later one.
"""

from __future__ import annotations

import doctest
import random
import time

import attrs
import numpy as np
import pytest
from _pipeline import ADD, APPEND, add, kcode, mul, pipeline, ptr, ref, scalar

import rxcuda
from rxcuda import Block, BlockBuilder, BufferStats
from rxcuda.lowlevel import (
    BufferArg,
    BufferPlan,
    GraphPlan,
    KernelNodePlan,
    Launch,
    MemsetNodePlan,
    PipelineDescription,
    plan,
)
from rxcuda.model._graphplan import RegionNodePlan
from rxcuda.plan import _liveness
from rxcuda.plan._liveness import buffer_stats, holds_own_value, shared_groups

N = 64
NBYTES = N * 4


# -- an independent check of the rule ----------------------------------------------------------------------
def _top(gp, nid):
    while nid in gp.parents:
        nid = gp.parents[nid][0]
    return nid


def _ancestors(gp, nid):
    seen, todo = set(), list(gp.deps[nid])
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(gp.deps[d])
    return seen


def _users(gp, buf):
    return {_top(gp, n.id) for n in gp.nodes if buf in n.reads or buf in n.writes}


def assert_lifetimes_disjoint(gp):
    """Every pair in every group: all uses of the earlier strictly before all uses of the later."""
    anc = {n.id: _ancestors(gp, n.id) for n in gp.nodes if _top(gp, n.id) == n.id}
    for group in gp.shared:
        assert len(group) >= 2 and len(set(group)) == len(group)
        for i, early in enumerate(group):
            for late in group[i + 1:]:
                for u in _users(gp, early):
                    for v in _users(gp, late):
                        assert u in anc[v], (gp.buffers[early].label, gp.buffers[late].label, u, v)
    assert gp.storage == {m: g[0] for g in gp.shared for m in g}


def labels(gp):
    return [[gp.buffers[b].label for b in g] for g in gp.shared]


def mul_chain(n, size=N):
    blocks = [mul(size, name=f"m{i}") for i in range(n)]
    desc = pipeline(*blocks, conns=[(a["out"], b["x"]) for a, b in zip(blocks, blocks[1:], strict=False)],
                    fed=[blocks[0]["x"]])
    return blocks, desc


# -- chains ---------------------------------------------------------------------------------------------------
def test_a_100_block_chain_keeps_its_intermediates_in_two_allocations():
    blocks, desc = mul_chain(100)
    gp = plan(desc)
    assert_lifetimes_disjoint(gp)
    assert len(gp.shared) == 2
    inter = {gp.port_buffers[ref(b["out"])] for b in blocks[:-1]}
    assert set(gp.storage) == inter  # every intermediate, and nothing else
    assert [gp.buffers[b].label for b in gp.shared[0][:3]] == ["m0.out", "m2.out", "m4.out"]
    s = buffer_stats(gp)
    # the fed input and the last output have their own; 99 intermediates take two buffers' worth
    assert (s.buffers, s.allocations, s.shared_groups) == (101, 4, 2)
    assert s.bytes_allocated == 4 * NBYTES and s.bytes_unshared == 101 * NBYTES and s.bytes_saved == 97 * NBYTES


def test_reuse_off_gives_every_buffer_its_own():
    _blocks, desc = mul_chain(10)
    gp = plan(desc, reuse_memory=False)
    assert gp.shared == () and gp.storage == {}
    s = buffer_stats(gp)
    assert s.bytes_allocated == s.bytes_unshared == 11 * NBYTES and s.bytes_saved == 0 and s.allocations == 11


def test_a_two_block_chain_has_nothing_to_share():
    _blocks, desc = mul_chain(2)
    assert plan(desc).shared == ()


def test_a_larger_buffer_joins_a_slot_that_grows_and_the_stats_count_the_largest():
    small1, big, small2, last = mul(64, "s1"), add(64, "big_in"), mul(64, "s2"), mul(64, "last")
    # s1 -> big_in.a ; big_in.b fed ; big_in -> s2 -> last ; all 64 elements: equal sizes share
    desc = pipeline(small1, big, small2, last, conns=[(small1["out"], big["a"]), (big["out"], small2["x"]),
                                                      (small2["out"], last["x"])],
                    fed=[small1["x"], big["b"]])
    gp = plan(desc)
    assert_lifetimes_disjoint(gp)
    assert labels(gp) == [["s1.out", "s2.out"]]
    # different sizes: the group is as large as its largest member
    b1 = Block.from_kernel(kcode("k", ptr("x"), ptr("out", "out"), scalar("n", default="size")), size=16, name="b1")
    b2 = Block.from_kernel(kcode("k", ptr("x"), ptr("out", "out"), scalar("n", default="size")), size=16, name="b2")
    widen = BlockBuilder("widen", size=16)
    k = widen.add_kernel(kcode("w", ptr("x"), ptr("out", "out")), threads=16)
    widen.input("x", k["x"], count=16)
    widen.output("out", k["out"], count=1000)
    wide = widen.build()
    b3 = Block.from_kernel(kcode("k", ptr("x"), ptr("out", "out"), scalar("n", default="size")), size=1000, name="b3")
    b4 = Block.from_kernel(kcode("k", ptr("x"), ptr("out", "out"), scalar("n", default="size")), size=1000, name="b4")
    desc = pipeline(b1, b2, wide, b3, b4, conns=[(b1["out"], b2["x"]), (b2["out"], wide["x"]),
                                                 (wide["out"], b3["x"]), (b3["out"], b4["x"])], fed=[b1["x"]])
    gp = plan(desc)
    assert_lifetimes_disjoint(gp)
    assert labels(gp) == [["b1.out", "widen.out"], ["b2.out", "b3.out"]]
    s = buffer_stats(gp)
    assert s.bytes_allocated == 16 * 4 + 2 * 4000 + 4000  # b1.x, two groups of 4000 bytes, b4.out
    assert s.bytes_unshared == 16 * 4 * 3 + 4000 * 3


def test_internal_buffers_share_too():
    def two_step(name):
        b = BlockBuilder(name, size=N)
        k1 = b.add_kernel(kcode("first", ptr("x"), ptr("out", "out"), scalar("n", default="size")))
        k2 = b.add_kernel(kcode("second", ptr("x"), ptr("out", "out"), scalar("n", default="size")))
        b.input("x", k1["x"])
        b.connect(k1["out"], k2["x"], name="mid")
        b.output("out", k2["out"])
        b.scalar("n", [k1["n"], k2["n"]])
        return b.build()

    blocks = [two_step(f"t{i}") for i in range(4)]
    desc = pipeline(*blocks, conns=[(a["out"], b["x"]) for a, b in zip(blocks, blocks[1:], strict=False)],
                    fed=[blocks[0]["x"]])
    gp = plan(desc)
    assert_lifetimes_disjoint(gp)
    shared = {label for group in labels(gp) for label in group}
    assert {"t0/mid", "t1/mid", "t2/mid", "t3/mid"} <= shared
    assert buffer_stats(gp).allocations == 4  # t0.x, t3.out, two slots for everything else


# -- concurrency: a diamond -------------------------------------------------------------------------------------
def test_the_two_branches_of_a_diamond_never_share():
    src, left, right, join = mul(name="src"), mul(name="left"), mul(name="right"), add(name="join")
    desc = pipeline(src, left, right, join, conns=[(src["out"], left["x"]), (src["out"], right["x"]),
                                                   (left["out"], join["a"]), (right["out"], join["b"])],
                    fed=[src["x"]])
    gp = plan(desc)
    assert gp.shared == ()  # left.out and right.out live together; src.out until both branches read it


def test_a_long_branch_beside_a_short_one_shares_only_within_itself():
    src = mul(name="src")
    long = [mul(name=f"long{i}") for i in range(6)]
    short = mul(name="short")
    join, after, end = add(name="join"), mul(name="after"), mul(name="end")
    conns = [(src["out"], long[0]["x"]), (src["out"], short["x"]), (long[-1]["out"], join["a"]),
             (short["out"], join["b"]), (join["out"], after["x"]), (after["out"], end["x"])]
    conns += [(a["out"], b["x"]) for a, b in zip(long, long[1:], strict=False)]
    desc = pipeline(src, *long, short, join, after, end, conns=conns, fed=[src["x"]])
    gp = plan(desc)
    assert_lifetimes_disjoint(gp)
    by_label = {gp.buffers[b].label: b for b in range(len(gp.buffers))}
    short_out = by_label["short.out"]
    group_of_short = next((g for g in gp.shared if short_out in g), ())
    # short runs concurrently with every block of the long branch: only buffers of after the join may follow it
    assert {gp.buffers[b].label for b in group_of_short} <= {"short.out", "join.out", "after.out"}
    assert any(len(g) >= 3 for g in gp.shared)  # the long branch itself reuses memory


@pytest.mark.parametrize("seed", range(25))
def test_random_dags_only_share_ordered_lifetimes(seed):
    rng = random.Random(seed)
    n = rng.randint(5, 40)
    blocks = [add(name=f"b{i}") for i in range(n)]
    conns, fed = [], [blocks[0]["a"], blocks[0]["b"]]
    for i in range(1, n):
        for port in ("a", "b"):
            if rng.random() < 0.85:
                conns.append((blocks[rng.randrange(max(0, i - 6), i)]["out"], blocks[i][port]))
            else:
                fed.append(blocks[i][port])
    desc = pipeline(*blocks, conns=conns, fed=fed)
    gp = plan(desc)
    assert_lifetimes_disjoint(gp)
    unshared = plan(desc, reuse_memory=False)
    assert gp.nodes == unshared.nodes and gp.deps == unshared.deps and gp.buffers == unshared.buffers
    assert buffer_stats(gp).bytes_unshared == buffer_stats(unshared).bytes_allocated


# -- what never shares --------------------------------------------------------------------------------------------
def test_kept_fed_and_bound_ports_never_share():
    blocks, desc = mul_chain(8)
    middle = blocks[3]["out"]
    base = plan(desc)
    assert gp_shares(base, middle)
    for kept in (middle, blocks[4]["x"]):  # an output, or the input it feeds: the same buffer
        gp = plan(attrs.evolve(desc, kept=frozenset({ref(kept)})))
        assert not gp_shares(gp, middle) and gp.shared
        assert_lifetimes_disjoint(gp)
    bound = pipeline(*blocks, conns=[(a["out"], b["x"]) for a, b in zip(blocks, blocks[1:], strict=False)],
                     fed=[blocks[0]["x"]], bindings={middle: ("f32", N)})
    gp = plan(bound)
    assert gp.buffers[gp.port_buffers[ref(middle)]].kind == "external" and not gp_shares(gp, middle)
    # a fed input holds what the host wrote: never shared (here the second input of an add in the chain)
    a = add(name="joiner")
    chain = [mul(name=f"c{i}") for i in range(4)]
    desc = pipeline(*chain, a, conns=[(chain[0]["out"], chain[1]["x"]), (chain[1]["out"], chain[2]["x"]),
                                      (chain[2]["out"], a["a"]), (a["out"], chain[3]["x"])],
                    fed=[chain[0]["x"], a["b"]])
    gp = plan(desc)
    assert gp.shared and not gp_shares(gp, a["b"])


def gp_shares(gp, port) -> bool:
    return gp.port_buffers[ref(port)] in gp.storage


def test_outputs_nothing_consumes_never_share():
    # two sinks off a chain: the user most likely reads them
    blocks, _ = mul_chain(6)
    tap = mul(name="tap")
    desc = pipeline(*blocks, tap, conns=[(a["out"], b["x"]) for a, b in zip(blocks, blocks[1:], strict=False)]
                    + [(blocks[1]["out"], tap["x"])], fed=[blocks[0]["x"]])
    gp = plan(desc)
    assert_lifetimes_disjoint(gp)
    assert not gp_shares(gp, tap["out"]) and not gp_shares(gp, blocks[-1]["out"])


def test_append_data_and_zero_filled_inputs_never_share():
    blocks = [mul(name=f"m{i}") for i in range(4)]
    app = Block.from_kernel(APPEND, size=N, name="app")
    after = [mul(name=f"n{i}") for i in range(4)]
    opt = BlockBuilder("opt", size=N)
    k = opt.add_kernel(ADD)
    opt.input("a", k["a"])
    opt.input("b", k["b"], required=False)  # unconnected: reads zeros every frame
    opt.output("out", k["out"])
    opt.scalar("n", k["n"])
    o = opt.build()
    chain = [*blocks, app, *after]
    conns = [(a[a.outputs[0].name], b[b.inputs[0].name]) for a, b in zip(chain, chain[1:], strict=False)]
    conns.append((after[-1]["out"], o["a"]))
    desc = pipeline(*chain, o, conns=conns, fed=[blocks[0]["x"]])
    gp = plan(desc)
    assert_lifetimes_disjoint(gp)
    assert gp.shared and not gp_shares(gp, app["out"])
    zeros = gp.port_buffers[ref(o["b"])]
    assert gp.buffers[zeros].kind == "zeros" and zeros not in gp.storage
    assert all(gp.buffers[b].kind in ("port", "internal") for b in gp.storage)


def test_a_buffer_read_before_it_is_written_keeps_its_value_and_never_shares():
    # 'acc' reads its output before writing it (inout): the value carries over from the last frame
    acc_code = kcode("acc", ptr("x"), ptr("state", "inout"), scalar("n", default="size"))
    blocks = [mul(name=f"m{i}") for i in range(3)]
    acc = Block.from_kernel(acc_code, size=N, name="acc")
    rest = [mul(name=f"r{i}") for i in range(3)]
    chain = [*blocks, acc, *rest]
    desc = pipeline(*chain, conns=[(a[a.outputs[0].name], b[b.inputs[0].name])
                                   for a, b in zip(chain, chain[1:], strict=False)], fed=[blocks[0]["x"]])
    gp = plan(desc)
    assert_lifetimes_disjoint(gp)
    assert gp.shared and not gp_shares(gp, acc["state"])


def test_delayed_connection_ends_never_share():
    blocks, desc = mul_chain(8)
    gp = plan(desc)
    assert gp_shares(gp, blocks[3]["out"])
    # pretend blocks[3].out feeds a delayed connection: the helper's plan names it in GraphPlan.delays
    cur = gp.port_buffers[ref(blocks[3]["out"])]
    with_delay = attrs.evolve(plan(desc, reuse_memory=False), delays={cur: cur})
    groups = shared_groups(with_delay, desc)
    assert groups and not any(cur in g for g in groups)


# -- regions, planned by hand -------------------------------------------------------------------------------------
def _kernel(nid, reads, writes, label):
    return KernelNodePlan(nid, 0, "k", "key", Launch(grid=1), tuple(BufferArg(b) for b in (*reads, *writes)),
                          frozenset(reads), frozenset(writes), label)


def _hand_plan(kind):
    """k0 -> [region: body k2 -> k3] -> k4 -> k5 -> k6 over internal buffers b0..b6.

    b0: k0 -> region (read by k2); b1: k2 -> k3 (inside the body); b2: k3 -> k4 (leaves the body);
    b3..b5: the chain after. With ``kind`` None the "region" is plain nodes."""
    bufs = tuple(BufferPlan(i, ("internal", 0, f"b{i}"), f"b{i}", "f32", N, "internal") for i in range(7))
    k0 = _kernel(0, (6,), (0,), "k0")
    nodes: list = [k0]
    parents = {}
    if kind is None:
        nodes += [_kernel(1, (0,), (1,), "k2"), _kernel(2, (1,), (2,), "k3")]
    else:
        nodes.append(RegionNodePlan(1, 99, kind, 1, frozenset({0, 1}), frozenset({1, 2}), kind))
        nodes += [_kernel(2, (0,), (1,), "k2"), _kernel(3, (1,), (2,), "k3")]
        parents = {2: (1, 0), 3: (1, 0)}
    base = len(nodes)
    nodes += [_kernel(base, (2,), (3,), "k4"), _kernel(base + 1, (3,), (4,), "k5"),
              _kernel(base + 2, (4,), (5,), "k6")]
    if kind is None:
        deps = ((), (0,), (1,), (2,), (3,), (4,))
    else:
        deps = ((), (0,), (), (2,), (1,), (4,), (5,))
    return GraphPlan(nodes=tuple(nodes), deps=deps, buffers=bufs, port_buffers={}, counters={}, slots={},
                     device_scalars={}, recapture={}, kernel_nodes={}, parents=parents)


def test_without_a_region_the_hand_plan_shares():
    gp = _liveness.share_memory(_hand_plan(None), PipelineDescription())
    assert_lifetimes_disjoint(gp)
    assert gp.shared == ((0, 2, 4), (1, 3, 5))  # b6 is read before anything writes it: it keeps its own


@pytest.mark.parametrize("kind", ["while", "for"])
def test_nothing_a_looping_region_uses_shares(kind):
    gp = _liveness.share_memory(_hand_plan(kind), PipelineDescription())
    assert_lifetimes_disjoint(gp)
    assert gp.shared == ((3, 5),)  # b0, b1, b2 never; the chain after the region still shares


def test_an_if_region_shares_only_what_is_written_outside_it():
    gp = _liveness.share_memory(_hand_plan("if"), PipelineDescription())
    assert_lifetimes_disjoint(gp)
    # b1 and b2 are written only in the body, which may not run: their value may come from an earlier frame
    assert gp.shared == ((0, 3, 5),)  # b0: written by k0 before the region, last used by it


def test_a_memset_covering_a_buffer_is_a_definite_write():
    bufs = tuple(BufferPlan(i, ("internal", 0, f"b{i}"), f"b{i}", "f32", N, "internal") for i in range(4))
    nodes = (MemsetNodePlan(0, 0, 0, N, "zero b0"), _kernel(1, (0,), (1,), "k1"), _kernel(2, (1,), (2,), "k2"),
             _kernel(3, (2,), (3,), "k3"))
    gp = GraphPlan(nodes=nodes, deps=((), (0,), (1,), (2,)), buffers=bufs, port_buffers={}, counters={}, slots={},
                   device_scalars={}, recapture={}, kernel_nodes={})
    shared = _liveness.share_memory(gp, PipelineDescription())
    assert shared.shared == ((0, 2), (1, 3))
    partial = attrs.evolve(gp, nodes=(MemsetNodePlan(0, 0, 0, N // 2, "zero half of b0"), *nodes[1:]))
    assert 0 not in _liveness.share_memory(partial, PipelineDescription()).storage


# -- the stats record ---------------------------------------------------------------------------------------------
def test_stats_read_well_and_start_at_zero():
    s = BufferStats(buffers=101, allocations=4, shared_groups=2, bytes_allocated=4 << 20, bytes_unshared=101 << 20)
    assert s.bytes_saved == 97 << 20
    assert str(s) == ("101 buffers in 4 allocations (2 shared groups): 4 MiB allocated, 101 MiB without "
                      "sharing, 97 MiB saved")
    assert str(BufferStats()) == "0 buffers in 0 allocations (0 shared groups): 0 B allocated, 0 B without " \
                                 "sharing, 0 B saved"
    assert buffer_stats(None) == BufferStats()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        s.buffers = 3  # type: ignore[misc]


def test_the_module_examples_run():
    result = doctest.testmod(_liveness)
    assert result.attempted > 0 and result.failed == 0


# -- speed ---------------------------------------------------------------------------------------------------------
def test_a_1000_block_chain_plans_its_memory_in_a_few_milliseconds():
    _blocks, desc = mul_chain(1000)
    gp = plan(desc, reuse_memory=False)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        groups = shared_groups(gp, desc)
        best = min(best, time.perf_counter() - t0)
    assert len(groups) == 2 and sum(map(len, groups)) == 999
    assert best < 0.02, f"memory reuse for 1000 blocks took {best * 1e3:.1f} ms"


# -- the engine (null driver) -------------------------------------------------------------------------------------
KERNELS = "kernels"


def engine_chain(engine, n=8, size=1024):
    blocks = [engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=size, scale=1.0, name=f"m{i}"))
              for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        engine.connect(a["out"], b["x"])
    engine.write(blocks[0]["x"], np.ones(size, np.float32))
    return blocks


def test_the_engine_allocates_one_buffer_per_group(engine, api):
    blocks = engine_chain(engine, 100)
    assert engine.stats == BufferStats()
    engine.tick()
    gp = engine.plan
    ptrs = engine._rt.graph.pointers
    inter = [gp.port_buffers[ref(b["out"])] for b in blocks[:-1]]
    assert len({ptrs[b] for b in inter}) == 2
    assert all(ptrs[m] == ptrs[g[0]] for g in gp.shared for m in g)
    own = [b.id for b in gp.buffers if b.id not in gp.storage]
    assert len({ptrs[b] for b in own} | {ptrs[b] for b in inter}) == len(own) + 2
    s = engine.stats
    assert (s.buffers, s.allocations, s.shared_groups) == (101, 4, 2)
    assert s.bytes_allocated == 4 * 4096 and s.bytes_saved == 97 * 4096
    assert "101 buffers in 4 allocations" in str(s)


def test_reuse_memory_off(api):
    with rxcuda.Engine(driver=api, reuse_memory=False) as engine:
        assert engine.reuse_memory is False
        engine_chain(engine, 10)
        engine.tick()
        assert engine.plan.shared == () and engine.stats.bytes_saved == 0
        assert len(set(engine._rt.graph.pointers.values())) == len(engine.plan.buffers)


def test_a_rebuild_keeps_the_shared_allocations(engine, api):
    engine_chain(engine)
    engine.tick()

    def memory():
        g = engine._rt.graph
        return {b.label: g.pointers[b.id] for b in g.plan.buffers}

    before = memory()
    assert engine.plan.shared
    other = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=1024, name="other"))
    engine.write(other["x"], np.ones(1024, np.float32))
    engine.tick()
    assert engine.rebuilds == 2
    after = memory()
    assert {k: after[k] for k in before} == before  # same groups, same keys: same memory


def test_reading_a_shared_intermediate_rebuilds_so_it_has_its_own_memory(engine, api):
    blocks = engine_chain(engine)
    engine.tick()
    port = blocks[2]["out"]
    assert engine.plan.port_buffers[ref(port)] in engine.plan.storage
    rebuilds = engine.rebuilds
    seen = []
    engine.diagnostics.subscribe(seen.append)
    out = engine.read(port)
    assert engine.rebuilds == rebuilds + 1
    gp = engine.plan
    assert gp.port_buffers[ref(port)] not in gp.storage and gp.shared  # the others still share
    assert ref(port) in engine.describe().kept
    assert out.shape == (1024,) and not out.any()  # its own, fresh memory: never another buffer's data
    # m2.out was not the last of its group: the last frame's value is gone, and the engine says so
    (warning,) = [d for d in seen if d.severity == "warning"]
    assert warning.subject == "m2.out" and "engine.keep(m2['out'])" in warning.message
    assert "reuse_memory=False" in warning.message
    engine.tick()
    engine.read(port)  # kept now: no more rebuilds
    assert engine.rebuilds == rebuilds + 1


def test_the_last_buffer_of_a_group_keeps_its_value_when_it_gets_its_own(engine, api):
    blocks = engine_chain(engine)
    engine.tick()
    gp = engine.plan
    last = next(g[-1] for g in gp.shared)
    port = next(b["out"] for b in blocks if gp.port_buffers[ref(b["out"])] == last)
    assert holds_own_value(gp, last)
    old = engine._rt.graph.pointers[last]
    mark = len(api.calls)
    seen = []
    engine.diagnostics.subscribe(seen.append)
    engine.read(port)
    new = engine._rt.graph.pointers[engine.plan.port_buffers[ref(port)]]
    copies = [args for name, args in api.calls[mark:] if name == "cuMemcpyDtoDAsync"]
    assert copies == [(new, old, 4096, int(engine._rt.stream))]
    assert not [d for d in seen if d.severity == "warning"]


def test_keep_before_the_first_frame_means_no_rebuild_on_read(engine, api):
    blocks = engine_chain(engine)
    engine.keep(blocks[3]["out"])
    engine.tick()
    assert engine.plan.port_buffers[ref(blocks[3]["out"])] not in engine.plan.storage
    rebuilds = engine.rebuilds
    engine.read(blocks[3]["out"])
    engine.array(blocks[3]["out"])
    assert engine.rebuilds == rebuilds


def test_observing_a_shared_port_rebuilds_before_its_first_readback(engine, api):
    blocks = engine_chain(engine)
    engine.tick()
    port = blocks[4]["out"]
    assert engine.plan.port_buffers[ref(port)] in engine.plan.storage
    got = []
    sub = engine.observe(port).subscribe(got.append)
    frame = engine.tick()
    assert frame.tiers[0] == "structure"
    assert engine.plan.port_buffers[ref(port)] not in engine.plan.storage
    assert len(got) == 1 and got[0].shape == (1024,)
    sub.dispose()


def test_writing_to_a_shared_port_keeps_it(engine, api):
    blocks = engine_chain(engine)
    engine.tick()
    port = blocks[5]["x"]  # an input connected from m4.out: the write lands in m4.out's buffer
    assert engine.plan.port_buffers[ref(port)] in engine.plan.storage
    engine.write(port, np.full(1024, 2.0, np.float32))
    engine.tick()
    assert engine.plan.port_buffers[ref(port)] not in engine.plan.storage


def test_a_removed_block_leaves_no_kept_ports(engine, api):
    blocks = engine_chain(engine)
    engine.keep(blocks[3]["out"])
    engine.remove(blocks[7])
    engine.keep(blocks[6]["out"])
    engine.remove(blocks[6])
    assert {r.block for r in engine.describe().kept} == {blocks[0].id, blocks[3].id}  # m0.x: written


def test_a_read_after_a_failed_unsharing_rebuild_is_refused(engine, api):
    blocks = engine_chain(engine)
    engine.tick()
    port = blocks[2]["out"]
    api.fail("cuGraphInstantiate", "CUDA_ERROR_OUT_OF_MEMORY", times=5)
    api.fail("cuGraphExecUpdate", "CUDA_ERROR_OUT_OF_MEMORY", times=5)
    with pytest.raises(RuntimeError, match=r"m2.out still shares its memory .* Engine\(reuse_memory=False\)"):
        engine.read(port)


# -- the real region and delay planners (the engine on the null driver) --------------------------------------------
def _around(engine, middle):
    """p0 -> p1 -> p2 -> middle(p2.out) -> q0 -> q1 -> q2; ``middle(engine, src)`` returns the port feeding q0."""
    pre = [engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=1024, name=f"p{i}")) for i in range(3)]
    post = [engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=1024, name=f"q{i}")) for i in range(3)]
    for chain in (pre, post):
        for a, b in zip(chain, chain[1:], strict=False):
            engine.connect(a["out"], b["x"])
    engine.connect(middle(engine, pre[-1]["out"]), post[0]["x"])
    engine.write(pre[0]["x"], np.ones(1024, np.float32))
    engine.tick()
    gp = engine.plan
    assert_lifetimes_disjoint(gp)
    return gp


def test_a_delayed_connection_keeps_both_ends_and_the_rest_shares(engine):
    def middle(engine, src):
        acc = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=1024, name="acc"))
        engine.connect(acc["out"], acc["a"], delay=1)
        engine.connect(src, acc["b"])
        return acc["out"]

    gp = _around(engine, middle)
    ((cur, prev),) = gp.delays.items()
    assert cur not in gp.storage and prev not in gp.storage
    assert labels(gp) == [["p0.out", "p2.out", "q0.out"], ["p1.out", "q1.out"]]


@pytest.mark.parametrize("kind", ["if", "for"])
def test_regions_share_only_what_runs_once_outside_a_loop(engine, kind):
    body = [Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=1024, name=f"b{i}") for i in range(3)]

    def middle(engine, src):
        if kind == "if":
            cmp = BlockBuilder("cmp", size=1)
            k = cmp.add_kernel(kcode("cmp", ptr("v"), ptr("flag", "out", "u32")), threads=1)
            cmp.input("v", k["v"], count=1024)
            cmp.output("flag", k["flag"], count=1)
            flag = engine.add(cmp.build())
            engine.connect(src, flag["v"])
            engine.add(rxcuda.If(flag["flag"], body))
        else:
            engine.add(rxcuda.For(3, body))
        for a, b in zip(body, body[1:], strict=False):
            engine.connect(a["out"], b["x"])
        engine.connect(src, body[0]["x"])
        return body[-1]["out"]

    gp = _around(engine, middle)
    inside = {gp.port_buffers[ref(b["out"])] for b in body}
    assert not any(len(inside & set(g)) > 1 for g in gp.shared)  # one region node uses them all: never ordered
    if kind == "for":
        assert not inside & set(gp.storage)  # a loop may run its body again: nothing it uses shares
        assert gp.port_buffers[ref(engine.blocks[2]["out"])] not in gp.storage  # p2.out: read by the loop
    assert gp.shared and engine.stats.bytes_saved > 0


def test_keep_names_what_is_wrong_with_the_port(engine):
    stray = Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=16, name="stray")
    with pytest.raises(rxcuda.ForeignBlockError, match=r"stray is not in this engine; engine.add\(block\) first"):
        engine.keep(stray["out"])
    engine.add(stray)
    with pytest.raises(rxcuda.UnknownPortError, match=r"block 'stray' has no port 'nope' \(ports: x, out\)"):
        engine.keep(stray["nope"])
    assert engine.describe().kept == frozenset()


def test_sizes_in_bytes_are_the_buffers_nbytes():
    """sizes_in_bytes (memory reuse's slot sizes, the item size looked up once per dtype) gives each BufferPlan's
    nbytes, the 4-byte minimum and untyped buffers included."""
    import random

    from rxcuda.model._graphplan import BufferPlan, sizes_in_bytes

    rng = random.Random(11)
    buffers = [BufferPlan(i, ("k", i), f"b{i}", rng.choice(["f32", "f64", "u8", "i16", None]),
                          rng.choice([0, 1, 3, 1024]), "port") for i in range(200)]
    assert sizes_in_bytes(buffers) == [b.nbytes for b in buffers]

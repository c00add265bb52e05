"""Append outputs, complete: several kernels and several blocks appending to one buffer through one counter
reset once per frame, the count as a device value other blocks take as an input, the count read back without
a sync and offered as an Observable, and the overflow / near-full warnings once per episode.

Planner rules run on descriptions; the engine's decisions run on the null driver, whose device-to-host copies
here land a count the test chooses (device memory itself holds nothing).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from _pipeline import APPEND, builder, kcode, pipeline, ptr, ref, scalar

import rxcuda
from rxcuda import Block, ValidationError
from rxcuda.blocks._appendstate import AppendState
from rxcuda.cuda import NullDriver
from rxcuda.engine._append import warning_text
from rxcuda.lowlevel import Connection, MemsetNodePlan, PipelineDescription, PortRef, plan

CAP = 256
# a second appending kernel (its own code, so the two are told apart)
BELOW = kcode("below", ptr("values"), ptr("out", "out"), ptr("count", "counter", "u32"),
              scalar("threshold", "f32", 0.0), scalar("capacity", "u32", "size"), scalar("n", default="size"))
# continues an upstream append buffer: its data pointer is 'inout'
MORE = kcode("more", ptr("values"), ptr("out", "inout"), ptr("count", "counter", "u32"),
             scalar("capacity", "u32", "size"), scalar("n", default="size"))
# reads the appended items and their count on the device
SUM = kcode("sum", ptr("items"), ptr("n", "in", "u32"), ptr("out", "out"), scalar("capacity", "u32", "size"))


def two_kernel_block(name: str = "hits", cap: int = CAP):
    b = builder(name, size=cap)
    hi = b.add_kernel(APPEND, name="hi")
    lo = b.add_kernel(BELOW, name="lo")
    b.input("values", [hi["values"], lo["values"]])
    b.output("hits", [hi["out"], lo["out"]], counter=[hi["count"], lo["count"]], count=cap)
    for s in ("threshold", "capacity", "n"):
        b.scalar(s, [hi[s], lo[s]])
    return b.build()


def summer(cap: int = CAP, name: str = "sum"):
    return Block.from_kernel(SUM, size=cap, name=name, counts={"n": 1})


def memsets(gp):
    return [n for n in gp.nodes if isinstance(n, MemsetNodePlan)]


# -- several kernels of one block --------------------------------------------------------------------------
def test_two_kernels_of_one_block_share_one_buffer_one_counter_and_one_reset():
    blk = two_kernel_block()
    spec = blk.description.port("hits")
    assert spec.counter_pins == (rxcuda.lowlevel.Pin("hi", 2), rxcuda.lowlevel.Pin("lo", 2))
    gp = plan(pipeline(blk, fed=[blk["values"]]))
    cid = gp.counters[ref(blk["hits"])]
    hi, lo = gp.kernel_nodes[(blk.id, "hi")], gp.kernel_nodes[(blk.id, "lo")]
    data = gp.port_buffers[ref(blk["hits"])]
    for k in (hi, lo):
        assert gp.nodes[k].args[1].buffer == data and gp.nodes[k].args[2].buffer == cid
    [reset] = memsets(gp)
    assert reset.buffer == cid and reset.id < hi < lo
    assert reset.id in gp.deps[hi] and hi in gp.deps[lo]  # reset, then one appender after the other


def test_one_kernel_append_output_keeps_a_single_counter_pin():
    ap = Block.from_kernel(APPEND, size=CAP)
    assert ap.description.port("out").counter == rxcuda.lowlevel.Pin("append", 2)


def test_several_data_pins_need_as_many_counters():
    b = builder("bad", size=CAP)
    hi, lo = b.add_kernel(APPEND, name="hi"), b.add_kernel(BELOW, name="lo")
    with pytest.raises(ValueError, match=r"append port 'hits' has 2 data parameter\(s\) and 1 counter\(s\)"):
        b.output("hits", [hi["out"], lo["out"]], counter=hi["count"])
    with pytest.raises(ValueError, match=r"several kernels may fill one output only as an append output"):
        b.output("hits", [hi["out"], lo["out"]])


def test_a_counter_goes_with_the_data_pointer_of_its_own_kernel():
    b = builder("bad", size=CAP)
    hi, lo = b.add_kernel(APPEND, name="hi"), b.add_kernel(BELOW, name="lo")
    with pytest.raises(ValidationError, match=r"pairs data parameter 'out' of 'hi' with counter 'count' of 'lo'"):
        b.output("hits", [hi["out"], lo["out"]], counter=[lo["count"], hi["count"]])
    b.output("hits", [hi["out"], lo["out"]], counter=[hi["count"], lo["count"]])  # the refusal left no claim


# -- several blocks: an in/out append port continues the buffer ---------------------------------------------
def test_from_kernel_makes_an_inout_pointer_with_a_counter_an_inout_append_port():
    more = Block.from_kernel(MORE, size=CAP)
    spec = more.description.port("out")
    assert (spec.direction, spec.counter, spec.required) == ("in", rxcuda.lowlevel.Pin("more", 2), False)
    assert "in/out append port out: f32[256]" in str(more)


def test_a_continuing_block_shares_the_buffer_and_counter_and_resets_nothing():
    first = Block.from_kernel(APPEND, size=CAP, name="first")
    more = Block.from_kernel(MORE, size=CAP, name="more")
    total = summer()
    gp = plan(pipeline(first, more, total, fed=[first["values"], more["values"]],
                       conns=[(first["out"], more["out"]), (more["out"], total["items"]),
                              (more["out"].count, total["n"])]))
    cid = gp.counters[ref(first["out"])]
    assert gp.counters[ref(more["out"])] == cid
    assert gp.port_buffers[ref(more["out"])] == gp.port_buffers[ref(first["out"])]
    [reset] = memsets(gp)
    assert reset.buffer == cid  # one reset, before the first appender
    a, m, s = (gp.kernel_nodes[k] for k in ((first.id, "append"), (more.id, "more"), (total.id, "sum")))
    assert a in gp.deps[m] and m in gp.deps[s]  # first appends, then more, then the sum reads both
    assert gp.port_buffers[ref(total["n"])] == cid  # the sum reads the count on the device


def test_an_unconnected_inout_append_port_owns_its_buffer_and_counter():
    more = Block.from_kernel(MORE, size=CAP, name="more")
    problems = rxcuda.lowlevel.check(pipeline(more, fed=[more["values"]]))
    assert problems == ()  # an optional append port: no "reads zeros" warning
    gp = plan(pipeline(more, fed=[more["values"]]))
    cid = gp.counters[ref(more["out"])]
    assert gp.buffers[gp.port_buffers[ref(more["out"])]].kind == "port"
    assert [r.buffer for r in memsets(gp)] == [cid]


def test_a_continued_append_port_read_elsewhere_is_an_error_naming_the_fix():
    first = Block.from_kernel(APPEND, size=CAP, name="first")
    more = Block.from_kernel(MORE, size=CAP, name="more")
    early = summer(name="early")
    desc = pipeline(first, more, early, fed=[first["values"], more["values"]],
                    conns=[(first["out"], more["out"]), (first["out"], early["items"]),
                           (first["out"].count, early["n"])])
    with pytest.raises(ValidationError) as info:
        plan(desc)
    messages = [p.message for p in info.value.problems if p.severity == "error"]
    assert ("early.items reads first.out, which more.out continues: it could run before more.out's items are in. "
            "Connect it to more.out instead, which holds every block's items") in messages
    assert any("early.n reads first.out.count" in m and "Connect it to more.out.count" in m for m in messages)


def test_an_append_port_is_continued_by_one_block_at_a_time():
    first = Block.from_kernel(APPEND, size=CAP, name="first")
    m1, m2 = Block.from_kernel(MORE, size=CAP, name="m1"), Block.from_kernel(MORE, size=CAP, name="m2")
    desc = pipeline(first, m1, m2, fed=[first["values"], m1["values"], m2["values"]],
                    conns=[(first["out"], m1["out"]), (first["out"], m2["out"])])
    with pytest.raises(ValidationError, match=r"first.out is continued by m1.out and by m2.out; an append buffer is "
                                              r"continued by one block at a time: chain them \(first.out -> m1.out "
                                              r"-> m2.out\)"):
        plan(desc)


def test_a_chain_of_three_appenders_shares_one_counter():
    first = Block.from_kernel(APPEND, size=CAP, name="first")
    m1, m2 = Block.from_kernel(MORE, size=CAP, name="m1"), Block.from_kernel(MORE, size=CAP, name="m2")
    gp = plan(pipeline(first, m1, m2, fed=[first["values"], m1["values"], m2["values"]],
                       conns=[(first["out"], m1["out"]), (m1["out"], m2["out"])]))
    assert {gp.counters[ref(p)] for p in (first["out"], m1["out"], m2["out"])} == {gp.counters[ref(first["out"])]}
    assert len(memsets(gp)) == 1


# -- the count as a device value: connection checks ----------------------------------------------------------
def test_count_of_a_plain_port_is_refused():
    m = Block.from_kernel(kcode("mul", ptr("x"), ptr("out", "out"), scalar("n", default="size")), size=8)
    with pytest.raises(ValidationError, match=r"mul.out is not an append port, so it has no count"):
        _ = m["out"].count
    assert repr(Block.from_kernel(APPEND, size=8)["out"].count) == "<port append.out.count>"


@pytest.mark.parametrize("count, dtype, shown", [(CAP, "u32", "u32[256]"), (1, "f32", "f32[1]")])
def test_a_count_connects_only_to_one_u32_element(count, dtype, shown):
    ap = Block.from_kernel(APPEND, size=CAP, name="ap")
    b = builder("use", size=CAP)
    k = b.add_kernel(kcode("use", ptr("n", "in", dtype), ptr("out", "out")))
    b.input("n", k["n"], count=count)
    b.output("out", k["out"])
    use = b.build()
    with rxcuda.Engine(driver=NullDriver()) as engine:
        engine.add(ap), engine.add(use)
        with pytest.raises(ValidationError) as info:
            engine.connect(ap["out"].count, use["n"])
        assert str(info.value) == (
            f"ap.out.count is the count of append port ap.out, one u32 on the device: it connects to an input of "
            f"one u32 element, and use.n is {shown}; declare the kernel parameter 'const unsigned int*' and the "
            "port with one element (BlockBuilder.input(..., count=1), or Block.from_kernel(..., "
            "counts={'<port>': 1}))")
        assert engine.connections == ()  # refused at once, nothing changed


def test_bad_append_connections_are_refused_with_the_fix():
    ap = Block.from_kernel(APPEND, size=CAP, name="ap")
    more = Block.from_kernel(MORE, size=CAP, name="more")
    plain = Block.from_kernel(kcode("mk", ptr("x"), ptr("out", "out"), scalar("n", default="size")), size=CAP,
                              name="plain")
    total = summer()
    with rxcuda.Engine(driver=NullDriver()) as engine:
        for b in (ap, more, plain, total):
            engine.add(b)
        with pytest.raises(ValidationError, match=r"more.out continues an append buffer, and ap.out.count is a "
                                                  r"count: connect the append port ap.out itself"):
            engine.connect(ap["out"].count, more["out"])
        with pytest.raises(ValidationError, match=r"more.out is an in/out append port: .* its source must be an "
                                                  r"append port .* and plain.out is a plain output"):
            engine.connect(plain["out"], more["out"])
        with pytest.raises(ValidationError, match=r"a delayed connection cannot feed it"):
            engine.connect(ap["out"], more["out"], delay=1)
        with pytest.raises(ValidationError, match=r"ap.out.count is an output port and cannot be a connection's "
                                                  r"target"):
            engine.connect(total["out"], ap["out"].count)
        engine.connect(ap["out"].count, total["n"])  # the right one goes through
        engine.connect(ap["out"], more["out"])
        assert len(engine.connections) == 2


def test_from_kernel_counts_gives_ports_other_sizes_and_names_unknown_ones():
    total = summer(cap=64)
    assert (total.description.port("n").count, total.description.port("items").count) == (1, 64)
    with pytest.raises(TypeError, match=r"'counts' names nope, which are not ports; the kernel's ports are items, "
                                        r"n, out"):
        Block.from_kernel(SUM, size=64, counts={"nope": 1})


# -- the episode logic ------------------------------------------------------------------------------------------
def test_warnings_once_per_episode():
    s = AppendState(100)
    seq = [(1, 50), (2, 95), (3, 99), (4, 101), (5, 150), (6, 96), (7, 120), (8, 92), (9, 130), (10, 89),
           (11, 200), (12, 10), (13, 95)]
    due = {f: s.update(f, raw, 100) for f, raw in seq}
    assert {f: d for f, d in due.items() if d} == {2: ("near_full",), 4: ("overflow",), 11: ("overflow",),
                                                   13: ("near_full",)}
    assert s.peak == 200 and s.last_count == 95 and not s.overflowed


def test_a_stale_count_changes_nothing_and_a_new_capacity_starts_afresh():
    s = AppendState(100)
    assert s.update(5, 150, 100) == ("overflow",) and s.overflowed and s.dropped == 50
    assert s.update(4, 10, 100) == () and s.last_count == 150  # frame 4 arrived after frame 5
    assert s.update(6, 150, 100) == ()
    assert s.update(7, 150, 200) == () and s.capacity == 200 and not s.overflowed and s.peak == 150
    assert s.update(8, 300, 200) == ("overflow",)


def test_warning_text_names_the_port_the_raw_count_the_capacity_and_the_fix():
    s = AppendState(100)
    s.update(3, 130, 100)
    assert warning_text("overflow", "emit.items", s, ["more.items"]) == (
        "emit.items overflowed in frame 3: the raw count is 130 but the capacity is 100, so 30 items were dropped; "
        "give emit.items a larger capacity (count=... where the port is declared, or a larger block size), and "
        "more.items, which continue it, the same. Said once until the count falls below 90 % of the capacity")
    s = AppendState(1000)
    s.update(2, 960, 1000)
    assert warning_text("near_full", "e.p", s, []).startswith(
        "e.p is 96 % full in frame 2: the raw count is 960, the capacity 1000; give e.p a larger capacity")


# -- the engine on the null driver ------------------------------------------------------------------------------
class CountingDriver(NullDriver):
    """A null driver whose 4-byte device-to-host copies land ``count`` (what the counter 'holds' when the copy is
    queued), and whose events report 'not ready' while ``busy`` is set."""

    def __init__(self):
        super().__init__()
        self.count_value = 0
        self.busy = False

    def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
        result = super().cuMemcpyDtoHAsync(dst, src, nbytes, stream)
        if nbytes == 4:
            ctypes.c_uint32.from_address(int(dst)).value = self.count_value
        return result

    def cuEventQuery(self, event):
        result = super().cuEventQuery(event)
        if self.busy:
            return (self.CUresult.CUDA_ERROR_NOT_READY,)
        return result


@pytest.fixture
def api():
    return CountingDriver()


def appender(engine, cap=CAP, name="emit"):
    ap = engine.add(Block.from_kernel(APPEND, size=cap, name=name))
    engine.write(ap["values"], np.ones(cap, np.float32))
    return ap


def copies(api, mark):
    return [a for n, a in api.calls[mark:] if n == "cuMemcpyDtoHAsync" and a[1] == 4]


def test_nobody_observing_adds_nothing_to_a_frame(engine, api):
    appender(engine)
    engine.tick()
    mark = len(api.calls)
    engine.tick()
    assert api.since(mark) == ["cuGraphLaunch", "cuStreamSynchronize"]


def test_an_observed_count_is_one_4_byte_copy_per_frame_shared_by_its_subscribers(engine, api):
    ap = appender(engine)
    engine.tick()
    got1, got2 = [], []
    s1 = engine.observe(ap["out"].count).subscribe(got1.append)
    s2 = engine.observe(ap["out"].count).subscribe(got2.append)
    cid = engine.plan.counters[PortRef(ap.id, "out")]
    ptr = engine._rt.graph.pointers[cid]
    api.count_value = 2
    engine.tick()  # the first copy makes the ring (pinned buffers, on the engine thread)
    for v in (3, 7):
        api.count_value = v
        mark = len(api.calls)
        engine.tick()
        assert api.since(mark)[:2] == ["cuGraphLaunch", "cuMemcpyDtoHAsync"]
        assert copies(api, mark) == [(ptr, 4, engine.stream.handle)]  # one copy for both, on the engine stream
    assert got1 == got2 == [2, 3, 7] and all(type(v) is int for v in got1)
    s1.dispose()
    api.count_value = 9
    engine.tick()
    assert got1 == [2, 3, 7] and got2 == [2, 3, 7, 9]
    s2.dispose()
    mark = len(api.calls)
    engine.tick()
    assert api.since(mark) == ["cuGraphLaunch", "cuStreamSynchronize"]  # the last one gone: nothing per frame


def test_unsynced_counts_arrive_later_oldest_first_through_the_ring(engine, api):
    ap = appender(engine)
    engine.tick()
    got: list[int] = []
    engine.observe(ap["out"].count).subscribe(got.append)
    api.busy = True
    for v in (11, 12, 13):
        api.count_value = v
        engine.tick(sync=False)
    assert got == []  # the copies have not finished: no wait, nothing emitted
    assert api.count("cuEventSynchronize") == 0
    api.busy = False
    api.count_value = 14
    engine.tick(sync=False)
    assert got == [11, 12, 13, 14]


def test_a_full_ring_waits_for_its_oldest_copy_and_emits_it_first(engine, api):
    ap = appender(engine)
    engine.tick()
    got: list[int] = []
    engine.observe(ap["out"].count).subscribe(got.append)
    api.busy = True
    for v in range(1, 7):  # the ring holds 4 copies in flight
        api.count_value = v
        engine.tick(sync=False)
    assert got == [1, 2] and api.count("cuEventSynchronize") == 2


def test_every_n_th_frame(engine, api):
    ap = appender(engine)
    engine.tick()  # frame 1
    every2, every3 = [], []
    engine.observe(ap["out"].count, every=2).subscribe(every2.append)
    engine.observe(ap["out"].count, every=3).subscribe(every3.append)
    mark = len(api.calls)
    for f in range(2, 8):
        api.count_value = f * 10
        engine.tick()
    assert every2 == [20, 40, 60] and every3 == [30, 60]
    assert len(copies(api, mark)) == 6  # gcd(2, 3) = 1: every frame
    with pytest.raises(ValueError, match=r"'every' must be a positive int"):
        engine.observe(ap["out"].count, every=0)


def test_overflow_and_near_full_warn_once_per_episode_with_the_raw_count(engine, api):
    ap = appender(engine, cap=100)
    engine.observe(ap["out"].count).subscribe(lambda v: None)
    for v in (10, 96, 98, 130, 140, 97, 50, 170, 171):
        api.count_value = v
        engine.tick()
    warnings = [d for d in engine.diagnostic_log if d.severity == "warning" and d.subject == "emit.out"]
    assert [d.message.split(":")[0] for d in warnings] == ["emit.out is 96 % full in frame 2",
                                                           "emit.out overflowed in frame 4",
                                                           "emit.out overflowed in frame 8"]
    assert "the raw count is 130 but the capacity is 100, so 30 items were dropped" in warnings[1].message
    assert "give emit.out a larger capacity" in warnings[1].message
    assert all(d.block == ap.id for d in warnings)
    port = ap["out"]
    assert port.overflowed and port.last_count == 171 and port.append_state.peak == 171
    assert ap["out"].count.overflowed  # the count's handle sees the same state
    assert "count 171 of 100 (171 %) in frame 9, peak 171, OVERFLOWED (71 dropped)" in str(ap)
    api.count_value = 5
    engine.tick()
    assert not port.overflowed and port.last_count == 5


def test_a_sync_count_and_read_update_the_state_too(engine, api):
    ap = appender(engine, cap=100)
    engine.tick()
    assert ap["out"].last_count is None and "count" not in str(ap).split("port out")[1]
    api.count_value = 120
    assert engine.count(ap["out"]) == 120 and ap["out"].overflowed
    assert engine.count(ap["out"].count) == 120
    np.testing.assert_array_equal(engine.read(ap["out"].count), np.array([120], np.uint32))
    assert len([d for d in engine.diagnostic_log if "overflowed" in d.message]) == 1  # one episode, one warning


def test_observing_the_append_data_updates_the_count_state(engine, api):
    ap = appender(engine, cap=100)
    got = []
    engine.observe(ap["out"]).subscribe(got.append)
    api.count_value = 150
    engine.tick()
    assert got and got[-1].size == 100  # only what fits
    assert ap["out"].overflowed and ap["out"].last_count == 150
    assert any(d.message.startswith("emit.out overflowed in frame 1") for d in engine.diagnostic_log)


def test_continuing_ports_share_the_state_and_the_warning_names_the_owner(engine, api):
    first = appender(engine, cap=100, name="first")
    more = engine.add(Block.from_kernel(MORE, size=100, name="more"))
    engine.write(more["values"], np.ones(100, np.float32))
    engine.connect(first["out"], more["out"])
    engine.observe(more["out"].count).subscribe(lambda v: None)
    api.count_value = 140
    engine.tick()
    assert first["out"].last_count == more["out"].last_count == 140
    [w] = [d for d in engine.diagnostic_log if "overflowed" in d.message]
    assert w.subject == "first.out" and w.block == first.id
    assert "and more.out, which continue it, the same" in w.message


def test_a_count_of_a_port_not_in_the_graph_is_skipped(engine, api):
    ap = appender(engine)
    engine.tick()
    got = []
    engine.observe(ap["out"].count).subscribe(got.append)
    engine.remove(ap)
    engine.tick()
    assert got == []


def test_closing_the_engine_completes_count_observers(api):
    engine = rxcuda.Engine(driver=api)
    ap = appender(engine)
    done = []
    engine.observe(ap["out"].count).subscribe(on_completed=lambda: done.append(1))
    engine.tick()
    engine.close()
    assert done == [1]
    assert not api.leaks().get("host")  # the ring's pinned buffers are freed


def test_a_failing_count_subscriber_is_reported_and_the_others_get_their_value(engine, api):
    ap = appender(engine)
    got = []

    def boom(v):
        raise RuntimeError("dashboard bug")

    engine.observe(ap["out"].count).subscribe(boom)
    engine.observe(ap["out"].count).subscribe(got.append)
    api.count_value = 4
    engine.tick()
    assert got == [4]
    assert any("dashboard bug" in d.message and d.subject == "observe emit.out.count" for d in engine.diagnostic_log)


def test_plan_descriptions_with_counts_are_plain_data():
    ap = Block.from_kernel(APPEND, size=CAP, name="ap")
    total = summer()
    desc = PipelineDescription(pipeline(ap, total).blocks,
                               (Connection(PortRef(ap.id, "out.count"), PortRef(total.id, "n")),
                                Connection(PortRef(ap.id, "out"), PortRef(total.id, "items"))),
                               fed=frozenset({PortRef(ap.id, "values")}))
    gp = plan(desc)
    assert gp.port_buffers[PortRef(total.id, "n")] == gp.counters[PortRef(ap.id, "out")]
    assert gp.buffers[gp.port_buffers[PortRef(ap.id, "out.count")]].kind == "counter"

"""Pictures of the graph (rxcuda.view): DOT text for engines, descriptions and plans, checked structurally.

Each picture is parsed by the small DOT reader below (nodes, edges, clusters and their nesting, attributes);
block labels are HTML-like tables, parsed as XML, so a wrong escape fails the parse. Rendering through Graphviz
is checked with a stand-in ``graphviz`` module, and for real where Graphviz is installed.
"""

from __future__ import annotations

import doctest
import importlib
import io
import pathlib
import re
import sys
import types
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import attrs
import numpy as np
import pytest
from _pipeline import APPEND, add, builder, kcode, mul, pipeline, ptr, scalar

import rxcuda
from rxcuda import Block, Composite, Engine, For, If, IfElse, While, _cli, plan, to_dot
from rxcuda.cuda import NullDriver
from rxcuda.lowlevel import PortRef

ROOT = pathlib.Path(__file__).resolve().parents[2]
FLAG = kcode("flag", ptr("x"), ptr("flag", "out", "u32"), scalar("n", default=64))
N = 4096


# -- a small DOT reader ------------------------------------------------------------------------------------
_TOKEN = re.compile(r'\s+|//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"|->|[{}\[\];,=:]|[A-Za-z0-9_.\-]+', re.S)


def _tokens(text: str) -> list[tuple[str, str]]:
    """(kind, value) tokens: 'id' (bare or quoted, unescaped), 'html' (the text inside <...>), or punctuation."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "<":  # an HTML string: balanced angle brackets
            depth, j = 0, i
            while True:
                depth += {"<": 1, ">": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
            out.append(("html", text[i + 1:j - 1]))
            i = j
            continue
        m = _TOKEN.match(text, i)
        assert m, f"unexpected character {text[i]!r} at {i}: {text[i:i + 40]!r}"
        tok = m.group()
        i = m.end()
        if tok.isspace() or tok.startswith(("//", "/*")):
            continue
        if tok.startswith('"'):
            body = tok[1:-1]
            assert not re.search(r'(?<!\\)(\\\\)*"', body), f"an unescaped quote in {tok}"
            out.append(("id", re.sub(r"\\(.)", lambda g: {"n": "\n"}.get(g.group(1), g.group(1)), body)))
        elif tok in "{}[];,=:" or tok == "->":
            out.append((tok, tok))
        else:
            out.append(("id", tok))
    return out


@dataclass
class Edge:
    tail: str
    tail_port: str | None
    head: str
    head_port: str | None
    attrs: dict


@dataclass
class Dot:
    name: str
    attrs: dict = field(default_factory=dict)  # graph attributes of the top level
    nodes: dict = field(default_factory=dict)  # id -> attributes
    parent: dict = field(default_factory=dict)  # node id or subgraph name -> the subgraph it sits in (None: top)
    subgraphs: dict = field(default_factory=dict)  # name -> graph attributes
    edges: list = field(default_factory=list)

    def children(self, sub: str | None) -> list[str]:
        return [s for s in self.subgraphs if self.parent[s] == sub]

    def inside(self, sub: str | None) -> list[str]:
        return [n for n in self.nodes if self.parent[n] == sub]

    def cluster(self, label: str) -> str:
        (found,) = [s for s, a in self.subgraphs.items() if a.get("label") == label]
        return found

    def ancestors(self, name: str) -> list[str]:
        out, p = [], self.parent[name]
        while p is not None:
            out.append(p)
            p = self.parent[p]
        return out


def parse_dot(text: str) -> Dot:
    toks = _tokens(text)
    pos = 0

    def peek(k=0):
        return toks[pos + k] if pos + k < len(toks) else ("eof", "")

    def take(kind=None):
        nonlocal pos
        tok = toks[pos]
        assert kind is None or tok[0] == kind, f"expected {kind}, got {tok} at token {pos}"
        pos += 1
        return tok

    def attr_list() -> dict:
        out = {}
        while peek()[0] == "[":
            take("[")
            while peek()[0] != "]":
                key = take("id")[1]
                take("=")
                out[key] = take()[1]
                if peek()[0] in (",", ";"):
                    take()
            take("]")
        return out

    def node_id():
        name = take("id")[1]
        port = None
        if peek()[0] == ":":
            take(":")
            port = take("id")[1]
            assert peek()[0] != ":", "compass points are not used"
        return name, port

    take("id")  # digraph
    dot = Dot(take("id")[1])
    take("{")

    def stmts(sub: str | None) -> None:
        while peek()[0] != "}":
            kind, value = peek()
            if kind == "id" and value == "subgraph":
                take()
                name = take("id")[1]
                assert name not in dot.subgraphs, f"subgraph {name} twice"
                dot.subgraphs[name], dot.parent[name] = {}, sub
                take("{")
                stmts(name)
                take("}")
            elif kind == "id" and value in ("graph", "node", "edge") and peek(1)[0] == "[":
                take()
                a = attr_list()
                if value == "graph":
                    (dot.attrs if sub is None else dot.subgraphs[sub]).update(a)
            elif kind == "id" and peek(1)[0] == "=":
                key = take()[1]
                take("=")
                (dot.attrs if sub is None else dot.subgraphs[sub])[key] = take()[1]
            else:
                chain = [node_id()]
                while peek()[0] == "->":
                    take("->")
                    chain.append(node_id())
                a = attr_list()
                if len(chain) == 1:
                    assert chain[0][0] not in dot.nodes, f"node {chain[0][0]} declared twice"
                    dot.nodes[chain[0][0]], dot.parent[chain[0][0]] = a, sub
                for (t, tp), (h, hp) in zip(chain, chain[1:], strict=False):
                    dot.edges.append(Edge(t, tp, h, hp, a))
            if peek()[0] == ";":
                take(";")

    stmts(None)
    take("}")
    assert pos == len(toks), "text after the graph"
    # every edge joins declared nodes (an undeclared one would be drawn as a stray box)
    assert not [e for e in dot.edges if e.tail not in dot.nodes or e.head not in dot.nodes]
    return dot


def table(label: str) -> ET.Element:
    """A block's HTML-like label, parsed as XML."""
    return ET.fromstring(label)


def ports(label: str) -> dict[str, str]:
    """PORT id -> the cell's text."""
    return {td.get("PORT"): "".join(td.itertext()) for td in table(label).iter("TD") if td.get("PORT")}


def texts(label: str) -> list[str]:
    return ["".join(td.itertext()) for td in table(label).iter("TD")]


def header_colour(label: str) -> str:
    return next(table(label).iter("TD")).get("BGCOLOR")


def edge(dot: Dot, tail: str, head: str) -> Edge:
    (found,) = [e for e in dot.edges if e.tail == tail and e.head == head]
    return found


def nid(block) -> str:
    return f"b{block.id}"


def flag_block(name: str = "check") -> Block:
    b = builder(name)
    k = b.add_kernel(FLAG)
    b.input("x", k["x"])
    b.output("flag", k["flag"], count=1)
    return b.build()


@pytest.fixture
def engine(api):
    e = Engine(driver=api)
    yield e
    e.close()


def feed(engine, *blocks, n=64):
    for b in blocks:
        for p in b.inputs:
            if not any(dst.block is b and dst.name == p.name for _src, dst in engine.connections):
                engine.write(p, np.ones(n, np.float32))


# -- pipelines ----------------------------------------------------------------------------------------------
def test_a_chain_has_one_node_per_block_and_edges_from_output_port_to_input_port(engine):
    a, m1, m2 = engine.add(add(N)), engine.add(mul(N, name="m1")), engine.add(mul(N, name="m2", scale=0.5))
    engine.connect(a["out"], m1["x"])
    engine.connect(m1["out"], m2["x"])
    feed(engine, a, n=N)
    engine.tick()
    dot = parse_dot(engine.to_dot())
    assert dot.name == "pipeline" and dot.attrs["rankdir"] == "LR"
    assert list(dot.nodes) == [nid(a), nid(m1), nid(m2)]
    assert dot.subgraphs == {}
    assert [(e.tail, e.tail_port, e.head, e.head_port) for e in dot.edges] == [
        (nid(a), "o_out", nid(m1), "i_x"), (nid(m1), "o_out", nid(m2), "i_x")]
    assert dot.edges[0].attrs["label"] == "f32[4096]\n16 KiB"
    assert "style" not in dot.edges[0].attrs
    label = dot.nodes[nid(a)]["label"]
    assert ports(label) == {"i_a": "a: f32[4096] (fed)", "i_b": "b: f32[4096] (fed)", "o_out": "out: f32[4096]"}
    assert texts(label)[0] == "add"
    assert "kernel add | ok" in texts(label)
    assert "scale = 0.5" in texts(dot.nodes[nid(m2)]["label"])[-1]
    assert header_colour(label) == rxcuda.view._dot.STATE_COLOURS["ok"][1]
    assert dot.attrs["label"] == f"engine on Null Device: frame {engine.frame}, 3 blocks, 2 connections"


def test_a_diamond_joins_two_branches_on_two_ports(engine):
    src, left, right, join = mul(name="src"), mul(name="left"), mul(name="right"), add(name="join")
    for b in (src, left, right, join):
        engine.add(b)
    engine.connect(src["out"], left["x"])
    engine.connect(src["out"], right["x"])
    engine.connect(left["out"], join["a"])
    engine.connect(right["out"], join["b"])
    feed(engine, src)
    dot = parse_dot(to_dot(engine))
    assert len(dot.nodes) == 4 and len(dot.edges) == 4
    assert {(e.tail, e.head, e.head_port) for e in dot.edges} == {
        (nid(src), nid(left), "i_x"), (nid(src), nid(right), "i_x"),
        (nid(left), nid(join), "i_a"), (nid(right), nid(join), "i_b")}
    assert {e.tail_port for e in dot.edges} == {"o_out"}
    # nothing was built yet: every block is "not built", drawn grey
    for n in dot.nodes.values():
        assert header_colour(n["label"]) == rxcuda.view._dot.STATE_COLOURS["not built"][1]
        assert texts(n["label"])[1].endswith("| not built")


def test_the_output_is_deterministic(engine):
    a, m = engine.add(add()), engine.add(mul())
    engine.connect(a["out"], m["x"])
    feed(engine, a)
    engine.tick()
    assert engine.to_dot() == engine.to_dot()
    assert engine.plan.to_dot() == to_dot(engine.plan) == to_dot(plan(engine.describe()))


def test_a_delayed_connection_is_dashed_labelled_and_does_not_order_the_layout(engine):
    acc = engine.add(add(name="acc"))
    engine.connect(acc["out"], acc["a"], delay=1)
    feed(engine, acc)
    dot = parse_dot(engine.to_dot())
    (e,) = dot.edges
    assert (e.tail, e.tail_port, e.head, e.head_port) == (nid(acc), "o_out", nid(acc), "i_a")
    assert e.attrs["style"] == "dashed" and e.attrs["constraint"] == "false"
    assert e.attrs["label"] == "delay 1\nf32[64]\n256 B"


def test_a_composite_nested_in_a_composite_is_a_cluster_in_a_cluster(engine):
    pair = Composite("pair")
    first = pair.add(mul(name="first"))
    second = pair.add(mul(name="second"))
    pair.connect(first["out"], second["x"])
    pair.expose("x", first["x"])
    pair.expose("y", second["out"])
    outer = Composite("outer")
    inner = outer.add(pair)
    post = outer.add(mul(name="post"))
    outer.connect(inner["y"], post["x"])
    outer.expose("x", inner["x"])
    free = engine.add(mul(name="free"))
    inst = engine.add(outer)
    engine.connect(free["out"], inst["x"])
    feed(engine, free)
    dot = parse_dot(engine.to_dot())
    top, nested = dot.cluster("composite outer"), dot.cluster("composite outer/pair")
    assert dot.parent[top] is None and dot.parent[nested] == top
    blocks = {b.name: b for b in engine.blocks}
    assert dot.inside(top) == [nid(blocks["outer/post"])]
    assert dot.inside(nested) == [nid(blocks["outer/pair/first"]), nid(blocks["outer/pair/second"])]
    assert dot.parent[nid(free)] is None
    assert len(dot.edges) == 3
    # the same composite added twice: two instances, two clusters
    engine.add(outer)
    dot = parse_dot(engine.to_dot())
    assert sorted(a["label"] for a in dot.subgraphs.values()) == [
        "composite outer", "composite outer/pair", "composite outer_2 (of outer)", "composite outer_2/pair"]


def test_if_is_a_cluster_holding_its_region_block_and_body(engine):
    check, inner, after = flag_block(), mul(name="inner"), mul(name="after")
    gate = If(check["flag"], [inner])
    engine.add(check)
    engine.add(gate)
    engine.add(after)
    engine.connect(inner["out"], after["x"])
    feed(engine, check, inner)
    engine.tick()
    dot = parse_dot(engine.to_dot())
    region = dot.cluster("If check.flag")
    assert region == f"cluster_region_{gate.id}" and dot.parent[region] is None
    assert dot.inside(region) == [nid(inner), nid(gate)]
    assert dot.parent[nid(check)] is None and dot.parent[nid(after)] is None
    cond = edge(dot, nid(check), nid(gate))
    assert (cond.tail_port, cond.head_port) == ("o_flag", "i_condition")
    assert cond.attrs["label"] == "u32[1]\n4 B"  # the condition port takes any type: the source's shows
    assert "region if | kernel rx_cond_set | ok" in texts(dot.nodes[nid(gate)]["label"])


def test_ifelse_has_then_and_else_clusters_and_an_empty_body_still_shows(engine):
    check, a = flag_block(), mul(name="a")
    branch = IfElse(check["flag"], [a], [], name="branch")
    engine.add(check)
    engine.add(branch)
    feed(engine, check, a)
    dot = parse_dot(engine.to_dot())
    region = dot.cluster("IfElse check.flag: branch")
    then, other = dot.children(region)
    assert (dot.subgraphs[then]["label"], dot.subgraphs[other]["label"]) == ("then", "else")
    assert dot.inside(then) == [nid(a)] and dot.inside(region) == [nid(branch)]
    (placeholder,) = dot.inside(other)
    assert dot.nodes[placeholder]["label"] == "(empty)"


def test_for_and_while_labels_show_their_count_and_condition(engine):
    step, check, body = mul(name="step"), flag_block(), mul(name="body")
    loop = For(5, [step])
    spin = While(check["flag"], [body, check], max_iterations=50)
    engine.add(loop)
    engine.add(spin)
    engine.connect(body["out"], check["x"])
    feed(engine, step, body)
    dot = parse_dot(engine.to_dot())
    assert dot.cluster("For n=5") == f"cluster_region_{loop.id}"
    spin_box = dot.cluster("While check.flag (at most 50 passes)")
    assert set(dot.inside(spin_box)) == {nid(body), nid(check), nid(spin)}
    loop.params["n"].value = 7  # a hot parameter: the next picture says so
    assert "For n=7" in [a["label"] for a in parse_dot(engine.to_dot()).subgraphs.values()]


def test_regions_nest_as_clusters(engine):
    check, a, b, c = flag_block(), mul(name="a"), mul(name="b"), mul(name="c")
    inner = For(3, [c], name="inner")
    branch = IfElse(check["flag"], [a, inner], [b])
    engine.add(check)
    engine.add(branch)
    feed(engine, check, a, b, c)
    dot = parse_dot(engine.to_dot())
    outer = dot.cluster("IfElse check.flag")
    loop = dot.cluster("For n=3: inner")
    then = next(s for s in dot.children(outer) if dot.subgraphs[s]["label"] == "then")
    assert dot.parent[loop] == then and dot.ancestors(nid(c)) == [loop, then, outer]
    assert dot.inside(loop) == [nid(c), nid(inner)]
    assert dot.inside(then) == [nid(a)]


def test_a_composite_inside_a_region_body_nests_in_it(engine):
    check = flag_block()
    pair = Composite("pair")
    first = pair.add(mul(name="first"))
    pair.expose("x", first["x"])
    engine.add(check)
    inst = engine.add(pair)
    gate = If(check["flag"], inst.blocks)
    engine.add(gate)
    feed(engine, check, *inst.blocks)
    dot = parse_dot(engine.to_dot())
    comp, region = dot.cluster("composite pair"), dot.cluster("If check.flag")
    assert dot.parent[comp] == region and dot.inside(comp) == [nid(inst.blocks[0])]


def test_a_composite_a_region_cuts_through_is_drawn_without_its_cluster(engine):
    check = flag_block()
    pair = Composite("pair")
    first, second = pair.add(mul(name="first")), pair.add(mul(name="second"))
    pair.connect(first["out"], second["x"])
    pair.expose("x", first["x"])
    engine.add(check)
    inst = engine.add(pair)
    gate = If(check["flag"], [inst.blocks[1]])  # only the second member runs in the region
    engine.add(gate)
    feed(engine, check, inst.blocks[0])
    dot = parse_dot(engine.to_dot())
    assert [a["label"] for a in dot.subgraphs.values()] == ["If check.flag"]
    assert dot.parent[nid(inst.blocks[0])] is None
    assert dot.parent[nid(inst.blocks[1])] == dot.cluster("If check.flag")


def test_a_block_that_failed_to_load_is_red_with_its_message(engine, api):
    a, m = engine.add(add()), engine.add(mul())
    engine.connect(a["out"], m["x"])
    feed(engine, a)
    engine.tick()
    other = kcode("other", ptr("x"), ptr("out", "out"), scalar("n", default="size"))
    extra = engine.add(Block.from_kernel(other, size=64, name="extra"))
    engine.connect(m["out"], extra["x"])
    api.fail("cuModuleLoadData", "CUDA_ERROR_INVALID_PTX")
    engine.tick()
    assert extra.state == "error"
    dot = parse_dot(engine.to_dot())
    node = dot.nodes[nid(extra)]
    assert header_colour(node["label"]) == rxcuda.view._dot.STATE_COLOURS["error"][1]
    assert "INVALID_PTX" in node["tooltip"] and node["tooltip"] == extra.message
    assert texts(node["label"])[1] == "kernel other | error"
    assert texts(node["label"])[2].endswith("...") and len(texts(node["label"])[2]) == 80  # cut; all in the tooltip
    assert header_colour(dot.nodes[nid(a)]["label"]) == rxcuda.view._dot.STATE_COLOURS["ok"][1]


def test_a_block_a_warning_names_is_amber(engine):
    check, body = flag_block(), mul(name="body")
    loop = While(check["flag"], [body])  # its flag comes from outside: the planner warns about the While
    engine.add(check)
    engine.add(loop)
    feed(engine, check, body)
    engine.tick()
    node = parse_dot(engine.to_dot()).nodes[nid(loop)]
    assert header_colour(node["label"]) == rxcuda.view._dot.STATE_COLOURS["warning"][1]
    assert "computed outside its body" in node["tooltip"]
    assert texts(node["label"])[1].endswith("| warning")


def test_a_block_in_state_ok_that_a_logged_warning_names_is_amber(engine):
    m = engine.add(mul())
    feed(engine, m)
    engine.tick()
    engine._rt.reporter.warn(m.name, "something odd about mul", m)  # as the engine reports a warning
    assert m.state == "ok" and engine.diagnostic_log[-1].block == m.id
    node = parse_dot(engine.to_dot()).nodes[nid(m)]
    assert header_colour(node["label"]) == rxcuda.view._dot.STATE_COLOURS["warning"][1]
    assert node["tooltip"] == "something odd about mul"
    assert "something odd about mul" in texts(node["label"])


def test_an_append_port_and_its_count_port(engine):
    src = engine.add(Block.from_kernel(APPEND, size=64, name="emit"))
    body = mul(name="body")
    gate = If(src["out"].count, [body])
    engine.add(gate)
    feed(engine, src, body)
    dot = parse_dot(engine.to_dot())
    label = dot.nodes[nid(src)]["label"]
    assert ports(label)["o_out"] == "out: f32[64] (append)"
    assert ports(label)["o_out_count"] == "out.count: u32[1]"
    cond = edge(dot, nid(src), nid(gate))
    assert cond.tail_port == "o_out_count" and cond.attrs["label"] == "u32[1]\n4 B"


def test_names_with_quotes_angle_brackets_ampersands_and_backslashes_are_escaped(engine):
    nasty = 'a "b" <c> & d\\e'
    check = flag_block()
    blk = mul(name=nasty)
    comp = Composite('c "x" <y> & z')
    comp.expose("x", comp.add(mul(name="m"))["x"])
    engine.add(check)
    engine.add(If(check["flag"], [blk], name='if "q" <r>'))
    inst = engine.add(comp)
    feed(engine, check, blk, *inst.blocks)
    text = engine.to_dot()
    dot = parse_dot(text)
    assert texts(dot.nodes[nid(blk)]["label"])[0] == nasty  # the HTML label parses and says the name
    labels = {a["label"] for a in dot.subgraphs.values()}
    assert labels == {'If check.flag: if "q" <r>', 'composite c "x" <y> & z'}
    # and a description with such a name, as a plain DOT string (the plan's node labels)
    gp = plan(engine.describe())
    node_labels = [a["label"] for a in parse_dot(to_dot(gp)).nodes.values()]
    assert any(lbl.startswith(f"{nasty}/mul\n") for lbl in node_labels)


def test_a_description_has_no_states_and_shows_shapes_from_a_plan():
    a = Block.from_kernel(kcode("k", ptr("x"), ptr("out", "out"), scalar("n", default="size")), shape=(8, 8),
                          name="grid")
    m = mul(64, name="flat")
    desc = pipeline(a, m, conns=[(a["out"], m["x"])], fed=[a["x"]])
    dot = parse_dot(to_dot(desc))
    assert dot.attrs["label"] == "pipeline: 2 blocks, 1 connection"
    label = dot.nodes[nid(a)]["label"]
    assert ports(label) == {"i_x": "x: f32[8x8] (fed)", "o_out": "out: f32[8x8]"}
    assert header_colour(label) == rxcuda.view._dot.STATE_COLOURS[None][1]
    assert texts(label)[1] == "kernel k"  # no state
    assert dot.edges[0].attrs["label"] == "f32[8x8]\n256 B"
    # the ports show the shapes a plan resolved for them
    gp = attrs.evolve(plan(desc), shapes={PortRef(m.id, "x"): (4, 16), PortRef(m.id, "out"): (4, 16)})
    label = parse_dot(to_dot(desc, plan=gp)).nodes[nid(m)]["label"]
    assert ports(label) == {"i_x": "x: f32[4x16]", "o_out": "out: f32[4x16]"}


def test_bound_inputs_are_marked():
    m = mul(64)
    desc = pipeline(m, bindings={m["x"]: ("f32", 64)})
    assert ports(parse_dot(to_dot(desc)).nodes[nid(m)]["label"])["i_x"] == "x: f32[64] (bound)"


# -- the graph plan -----------------------------------------------------------------------------------------
def test_a_plan_is_drawn_node_by_node_with_its_dependencies(engine):
    a, m = engine.add(add(name="a")), engine.add(mul(name="m"))
    engine.connect(a["out"], m["x"])
    engine.connect(m["out"], a["a"], delay=1)
    feed(engine, a)
    engine.tick()
    gp = engine.plan
    dot = parse_dot(gp.to_dot())
    assert dot.name == "plan" and list(dot.nodes) == [f"n{n.id}" for n in gp.nodes]
    assert sorted((e.tail, e.head) for e in dot.edges) == sorted(
        (f"n{d}", f"n{n.id}") for n in gp.nodes for d in gp.deps[n.id])
    kernel = dot.nodes["n0"]
    assert kernel["shape"] == "box" and kernel["label"] == "a/add\ngrid 1 x block 256"
    copy = next(v for v in dot.nodes.values() if v["shape"] == "cds")
    assert copy["label"] == "delay m.out\ncopy 256 B"
    assert edge(dot, "n0", "n1").attrs["label"] == "a.out"
    assert dot.attrs["label"] == "3 graph nodes, 4 buffers (1 KiB)"


def test_a_plan_draws_region_bodies_as_clusters(engine):
    check, a, b, c = flag_block(), mul(name="a"), mul(name="b"), mul(name="c")
    branch = IfElse(check["flag"], [a, For(2, [c], name="loop")], [b])
    engine.add(check)
    engine.add(branch)
    engine.add(after := mul(name="after"))
    engine.connect(b["out"], after["x"])
    feed(engine, check, a, b, c)
    gp = plan(engine.describe())
    dot = parse_dot(to_dot(gp))
    by_label = {v["label"].split("\n")[0]: k for k, v in dot.nodes.items()}
    region = dot.cluster("IfElse region: ifelse")
    then, other = dot.children(region)[:2]
    assert (dot.subgraphs[then]["label"], dot.subgraphs[other]["label"]) == ("then", "else")
    loop = dot.cluster("For region: loop")
    assert dot.parent[loop] == then
    assert dot.parent[by_label["a/mul"]] == then and dot.parent[by_label["b/mul"]] == other
    assert dot.parent[by_label["c/mul"]] == loop
    anchor = f"n{next(n.id for n in gp.nodes if n.label == 'ifelse' and type(n).__name__ == 'RegionNodePlan')}"
    assert dot.parent[anchor] == region and dot.nodes[anchor]["shape"] == "diamond"
    zero = next(k for k, v in dot.nodes.items() if v["shape"] == "note")
    assert dot.parent[zero] is None and dot.nodes[zero]["label"].split("\n")[1].startswith("memset ")
    leaving = edge(dot, anchor, by_label["after/mul"])
    assert leaving.attrs["ltail"] == region  # drawn from the region's border


# -- bad input -----------------------------------------------------------------------------------------------
def test_to_dot_names_what_it_draws():
    with pytest.raises(TypeError, match="an Engine, a PipelineDescription .* or a GraphPlan"):
        to_dot(42)
    m = mul()
    desc = pipeline(m, fed=[m["x"]])
    with pytest.raises(TypeError, match="'plan' is a GraphPlan"):
        to_dot(desc, plan="nope")
    with pytest.raises(TypeError, match="'plan' goes with a PipelineDescription"):
        to_dot(plan(desc), plan=plan(desc))


# -- save_graph ------------------------------------------------------------------------------------------------
def _no_graphviz(monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)  # `import graphviz` raises ImportError


def test_save_graph_to_dot_needs_no_graphviz(engine, tmp_path, monkeypatch):
    _no_graphviz(monkeypatch)
    engine.add(mul())
    out = engine.save_graph(tmp_path / "pipeline.dot")
    assert out == tmp_path / "pipeline.dot" and out.read_text() == engine.to_dot()
    assert rxcuda.save_graph(engine, str(tmp_path / "x.gv")).read_text() == engine.to_dot()
    assert rxcuda.save_graph(engine, tmp_path / "noext", format="dot").read_text() == engine.to_dot()


def test_rendering_without_the_graphviz_package_says_how_to_install_it(engine, tmp_path, monkeypatch):
    _no_graphviz(monkeypatch)
    engine.add(mul())
    with pytest.raises(rxcuda.GraphvizNotFoundError) as e:
        engine.save_graph(tmp_path / "pipeline.svg")
    msg = str(e.value)
    assert "pip install graphviz" in msg and "apt install graphviz" in msg and "brew install graphviz" in msg
    assert ".dot" in msg and isinstance(e.value, RuntimeError) and isinstance(e.value, rxcuda.RxcudaError)
    assert not (tmp_path / "pipeline.svg").exists()


def _fake_graphviz(monkeypatch, pipe):
    mod = types.ModuleType("graphviz")

    class ExecutableNotFound(RuntimeError):
        pass

    class Source:
        def __init__(self, text):
            self.text = text

        def pipe(self, format=None):
            return pipe(self.text, format, ExecutableNotFound)

    mod.ExecutableNotFound, mod.Source = ExecutableNotFound, Source
    monkeypatch.setitem(sys.modules, "graphviz", mod)


def test_rendering_without_the_dot_program_says_how_to_install_it(engine, tmp_path, monkeypatch):
    def missing(text, fmt, not_found):
        raise not_found("failed to execute PosixPath('dot')")

    _fake_graphviz(monkeypatch, missing)
    engine.add(mul())
    with pytest.raises(rxcuda.GraphvizNotFoundError, match="dot program.*apt install graphviz"):
        engine.save_graph(tmp_path / "pipeline.png")


def test_rendering_writes_what_graphviz_makes_in_the_format_of_the_suffix(engine, tmp_path, monkeypatch):
    seen = []

    def ok(text, fmt, _):
        seen.append((text, fmt))
        return b"%PDF-fake"

    _fake_graphviz(monkeypatch, ok)
    engine.add(mul())
    out = engine.save_graph(tmp_path / "pipeline.PDF")
    assert out.read_bytes() == b"%PDF-fake" and seen == [(engine.to_dot(), "pdf")]
    rxcuda.save_graph(engine.describe(), tmp_path / "p.out", format="svg")
    assert seen[-1][1] == "svg" and seen[-1][0].startswith("digraph pipeline {")


@pytest.mark.parametrize(("name", "fmt", "error", "match"), [
    ("pipeline", None, ValueError, "no suffix.*format='svg'"),
    ("pipeline.jpg", None, ValueError, "format 'jpg' is not one save_graph writes; use one of svg, png, pdf"),
    ("pipeline.svg", "bmp", ValueError, "format 'bmp'"),
    ("pipeline.svg", 3, TypeError, "'format' is a str"),
])
def test_save_graph_refuses_formats_it_does_not_write(engine, tmp_path, name, fmt, error, match):
    with pytest.raises(error, match=match):
        engine.save_graph(tmp_path / name, fmt)


def test_save_graph_needs_a_path(engine):
    with pytest.raises(TypeError, match="'path' is a file name or a path"):
        engine.save_graph(None)


def test_rendering_through_graphviz_where_it_is_installed(engine, tmp_path):
    gv = pytest.importorskip("graphviz", reason="the graphviz Python package is not installed (pip install graphviz)")
    try:
        gv.version()
    except Exception as e:
        pytest.skip(f"Graphviz's dot program is not usable here: {e}")
    check, body = flag_block(), mul(name='a "b" <c> & d')
    engine.add(check)
    engine.add(IfElse(check["flag"], [body], [For(2, [mul(name="c")])]))
    feed(engine, check, body, *[b for b in engine.blocks if b.name == "c"])
    engine.tick()
    svg = engine.save_graph(tmp_path / "pipeline.svg").read_text()
    assert svg.lstrip().startswith(("<?xml", "<svg")) and "IfElse check.flag" in svg
    assert "&lt;c&gt; &amp; d" in svg
    rxcuda.save_graph(engine.plan, tmp_path / "plan.svg")
    assert "For region: for" in (tmp_path / "plan.svg").read_text()


# -- the driver's own graph -------------------------------------------------------------------------------------
def test_save_driver_graph_on_the_null_driver_writes_its_placeholder(engine, api, tmp_path):
    a = engine.add(add())
    feed(engine, a)
    out = engine.save_driver_graph(tmp_path / "driver.dot")  # builds the graph first
    assert engine.plan is not None
    text = out.read_text()
    assert "NullDriver" in text and "1 nodes added" in text
    parse_dot(text)
    (call,) = [args for name, args in api.calls if name == "cuGraphDebugDotPrint"]
    assert call[1:] == (str(tmp_path / "driver.dot"), 0)
    engine.save_driver_graph(tmp_path / "verbose.dot", verbose=True)
    from cuda.bindings import driver

    assert api.calls[-1][1][2] == int(driver.CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE)


def test_save_driver_graph_errors_say_what_is_wrong(engine, api, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        engine.save_driver_graph(tmp_path / "nowhere" / "driver.dot")
    with pytest.raises(TypeError, match="'path'"):
        engine.save_driver_graph(3)
    with pytest.raises(TypeError, match="takes an Engine"):
        rxcuda.view.save_driver_graph(pipeline(mul()), tmp_path / "x.dot")
    bad = engine.add(mul())  # its required input is neither connected nor fed: nothing builds
    with pytest.raises(RuntimeError, match="no working graph"):
        engine.save_driver_graph(tmp_path / "driver.dot")
    feed(engine, bad)
    with pytest.raises(rxcuda.CudaError, match="cuGraphDebugDotPrint failed with CUDA_ERROR_OPERATING_SYSTEM"):
        engine.save_driver_graph(tmp_path)  # a folder, not a file: the driver cannot write it
    engine.close()
    with pytest.raises(rxcuda.EngineClosedError):
        engine.save_driver_graph(tmp_path / "driver.dot")


def test_the_driver_graph_is_the_engines_own_work(engine, api, tmp_path, monkeypatch):
    """The CUDA layer draws it (rxcuda.engine._views): nothing rxcuda.view provides is needed, and
    rxcuda.view.save_driver_graph(engine, path) is the engine's method."""
    from rxcuda.model import _provided

    feed(engine, engine.add(mul()))
    monkeypatch.setattr(_provided, "_functions", {})  # as if rxcuda.view had not been loaded
    assert "NullDriver" in engine.save_driver_graph(tmp_path / "own.dot").read_text()
    with pytest.raises(ImportError, match="to_dot is done by rxcuda.view"):
        engine.to_dot()
    out = rxcuda.view.save_driver_graph(engine, tmp_path / "view.dot", verbose=True)
    assert out == tmp_path / "view.dot" and out.read_text() == (tmp_path / "own.dot").read_text()
    from cuda.bindings import driver

    flags = [args[2] for name, args in api.calls if name == "cuGraphDebugDotPrint"]
    assert flags == [0, int(driver.CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE)]


def test_a_closed_compiled_graph_has_nothing_to_describe(engine, tmp_path):
    feed(engine, engine.add(mul()))
    engine.tick()
    g = engine._rt.graph
    g.close()
    with pytest.raises(RuntimeError, match="closed"):
        g.debug_dot(tmp_path / "x.dot")
    engine._rt.graph = None  # closed by hand above; the engine must not close it again


# -- the conveniences, the command line, the docs -------------------------------------------------------------
def test_the_pictures_are_the_classes_own_methods_done_by_rxcuda_view(monkeypatch):
    """Engine.to_dot, save_graph, save_driver_graph (rxcuda.engine._views) and GraphPlan.to_dot are declared on the
    classes and call the functions rxcuda.view provides (rxcuda.model._provided); none is attached by rxcuda.view."""
    from rxcuda.engine._views import EngineViews
    from rxcuda.model import _provided

    for name in ("to_dot", "save_graph", "save_driver_graph"):
        assert getattr(Engine, name) is EngineViews.__dict__[name]
    assert "to_dot" in rxcuda.GraphPlan.__dict__
    assert rxcuda.to_dot is rxcuda.view.to_dot and rxcuda.save_graph is rxcuda.view.save_graph
    seen = []
    monkeypatch.setitem(_provided._functions, "to_dot", lambda x: seen.append(x) or "digraph {}")
    plan = object.__new__(rxcuda.GraphPlan)
    assert rxcuda.GraphPlan.to_dot(plan) == "digraph {}" and seen == [plan]
    monkeypatch.delitem(_provided._functions, "to_dot")
    with pytest.raises(ImportError, match="to_dot is done by rxcuda.view, which is not loaded"):
        rxcuda.GraphPlan.to_dot(plan)


def test_demo_plan_dot_writes_the_demo_pipeline(tmp_path, capsys):
    out = tmp_path / "demo.dot"
    assert _cli.main(["demo", "--plan", "--size", "1000", "--dot", str(out)]) == 0
    assert f"wrote a picture of the pipeline to {out}" in capsys.readouterr().out
    dot = parse_dot(out.read_text())
    names = [texts(n["label"])[0] for n in dot.nodes.values()]
    assert names == ["vector_add", "scalar_mul", "append_above"]
    assert [(e.tail_port, e.head_port) for e in dot.edges] == [("o_out", "i_x"), ("o_out", "i_values")]
    assert all(e.attrs["label"] == "f32[1000]\n3.91 KiB" for e in dot.edges)


@pytest.mark.parametrize(("arg", "match"), [("demo.jpg", "does not write 'jpg'"), ("demo", "no suffix"),
                                            ("nowhere/demo.dot", "does not exist")])
def test_demo_dot_refuses_a_file_it_cannot_write_before_any_work(tmp_path, capsys, arg, match):
    assert _cli.main(["demo", "--plan", "--dot", str(tmp_path / arg)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rxcuda demo: error: --dot ") and re.search(match, err) and err.count("\n") == 1
    assert "format=" not in err and "give - for DOT text on standard output" in err or "does not exist" in err


def test_demo_dot_dash_writes_dot_alone_on_standard_output(capsys):
    """``--dot -``, as Graphviz users expect (rxcuda demo --plan --dot - | dot -Tsvg): the DOT text is all of
    standard output, and the report goes to standard error."""
    assert _cli.main(["demo", "--plan", "--size", "1000", "--dot", "-"]) == 0
    captured = capsys.readouterr()
    dot = parse_dot(captured.out)
    assert [texts(n["label"])[0] for n in dot.nodes.values()] == ["vector_add", "scalar_mul", "append_above"]
    assert captured.out.startswith("digraph ") and "graph nodes" in captured.err


def test_demo_dot_without_graphviz_is_one_line(tmp_path, capsys, monkeypatch):
    _no_graphviz(monkeypatch)
    assert _cli.main(["demo", "--plan", "--dot", str(tmp_path / "demo.svg")]) == 2
    assert "pip install graphviz" in capsys.readouterr().err


def test_demo_run_dot_shows_the_states_after_the_run(tmp_path):
    out = io.StringIO()
    path = tmp_path / "run.dot"
    kernels = _cli.find_kernels()
    code = _cli.run_demo(kernels, 3, 64, lambda: Engine(driver=NullDriver()), out, dot=path)
    assert code in (0, 1)  # the null driver computes nothing: the NumPy check may disagree; the flow is the test
    dot = parse_dot(path.read_text())
    assert len(dot.nodes) == 3
    for n in dot.nodes.values():
        assert header_colour(n["label"]) == rxcuda.view._dot.STATE_COLOURS["ok"][1]
    assert f"wrote a picture of the pipeline to {path}" in out.getvalue()


@pytest.mark.parametrize("module", ["rxcuda.view", "rxcuda.view._dot"])
def test_docstring_examples_run(module, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0

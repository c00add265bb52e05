"""Composite blocks and engine.replace on a GPU: results against NumPy on fresh random data.

A three-kernel composite (scalar_mul -> saxpy -> vector_add) nested one level inside another with a fourth
kernel, used twice in one pipeline; a composite parameter hot-updated (no rebuild); blocks inside replaced
in place, with an equal description (no rebuild) and with other code (one rebuild).
"""

import numpy as np
import pytest

from rxcuda import Block, Composite

N = 50_001  # not a multiple of the block size


def rand(rng, n=N):
    return rng.standard_normal(n).astype(np.float32) + 0.5


def stage(kernels) -> Composite:
    """y = gain * (gain * x) + b + c: gain sets both scalar_mul's scale and saxpy's a."""
    c = Composite("stage")
    m = c.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="m"))
    s = c.add(Block.from_kernel(kernels / "saxpy.ptx", size=N, name="s"))
    v = c.add(Block.from_kernel(kernels / "vector_add.ptx", size=N, name="v"))
    c.connect(m["out"], s["x"])
    c.connect(s["y_out"], v["a"])
    c.expose("x", m["x"])
    c.expose("b", s["y"])
    c.expose("c", v["b"])
    c.expose("y", v["out"])
    c.expose_parameter("gain", m.params["scale"], s.params["a"])
    return c


def outer(kernels) -> Composite:
    """y = post * stage(x, b, c): the stage nested one level."""
    o = Composite("outer")
    inner = o.add(stage(kernels))
    post = o.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="post"))
    o.connect(inner["y"], post["x"])
    for name in ("x", "b", "c"):
        o.expose(name, inner[name])
    o.expose("y", post["out"])
    o.expose_parameter("gain", inner.params["gain"])
    o.expose_parameter("post", post.params["scale"])
    return o


def expected(x, b, c, gain, post, sub=False):
    g, p = np.float32(gain), np.float32(post)
    s = g * (g * x) + b  # float32 throughout, as the kernels compute it
    return p * (s - c if sub else s + c)


def test_a_nested_composite_used_twice_with_hot_updates_and_replacements(engine, rng, kernels):
    o = outer(kernels)
    one, two = engine.add(o), engine.add(o)
    assert [b.name for b in two.blocks] == ["outer_2/stage/m", "outer_2/stage/s", "outer_2/stage/v", "outer_2/post"]
    engine.connect(one["y"], two["x"])
    x, b1, c1, b2, c2 = (rand(rng) for _ in range(5))
    engine.write(one["x"], x)
    for inst, b, c in ((one, b1, c1), (two, b2, c2)):
        engine.write(inst["b"], b)
        engine.write(inst["c"], c)
    g1, p1, g2, p2 = (float(v) for v in rng.uniform(0.5, 2.0, 4))
    one.set(gain=g1, post=p1)
    two.set(gain=g2, post=p2)
    engine.tick()
    engine.read(two["y"])  # the first read of a port may rebuild once to keep its memory apart
    tol = dict(rtol=1e-5, atol=1e-5)

    def check(sub=False):
        engine.tick()
        y1 = expected(x, b1, c1, g1, p1)
        np.testing.assert_allclose(engine.read(two["y"]), expected(y1, b2, c2, g2, p2, sub), **tol)

    check()
    rebuilds = engine.rebuilds

    # a composite parameter: every inner parameter it stands for, hot (no rebuild)
    g1 = float(rng.uniform(0.5, 2.0))
    one.params["gain"].value = g1
    assert engine.tick().tiers == ("parameters",)
    check()
    assert engine.rebuilds == rebuilds

    # an equal block in post's place: nothing rebuilt, its value carried over, the composite parameter follows
    twin = Block.from_kernel(kernels / "scalar_mul.ptx", size=N)
    engine.replace(one.members["post"], twin)
    assert twin.name == "outer/post" and twin.params["scale"].value == pytest.approx(p1)
    check()
    assert engine.rebuilds == rebuilds
    p1 = float(rng.uniform(0.5, 2.0))
    one.params["post"].value = p1
    assert twin.params["scale"].value == pytest.approx(p1)
    check()
    assert engine.rebuilds == rebuilds

    # other code in the second instance's vector_add place: one rebuild, the connections kept
    inner = two.members["stage"]
    engine.replace(inner.members["v"], Block.from_kernel(kernels / "vector_sub.ptx", size=N))
    check(sub=True)
    assert engine.rebuilds == rebuilds + 1


def test_instances_are_independent_and_removal_takes_every_block(engine, rng, kernels):
    s = stage(kernels)
    a, b = engine.add(s), engine.add(s)
    ins = {name: rand(rng) for name in ("xa", "ba", "ca", "xb", "bb", "cb")}
    for inst, k in ((a, "a"), (b, "b")):
        for port in ("x", "b", "c"):
            engine.write(inst[port], ins[port + k])
    ga, gb = (float(v) for v in rng.uniform(0.5, 2.0, 2))
    a.params["gain"].value = ga
    b.params["gain"].value = gb
    engine.tick()
    for inst, k, g in ((a, "a", ga), (b, "b", gb)):
        want = expected(ins["x" + k], ins["b" + k], ins["c" + k], g, 1.0)
        np.testing.assert_allclose(engine.read(inst["y"]), want, rtol=1e-5, atol=1e-5)
    engine.remove(a)
    assert engine.blocks == b.blocks
    engine.tick()
    want = expected(ins["xb"], ins["bb"], ins["cb"], gb, 1.0)
    np.testing.assert_allclose(engine.read(b["y"]), want, rtol=1e-5, atol=1e-5)

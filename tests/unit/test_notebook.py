"""An engine in a notebook on the null driver: its HTML repr, and the widgets bound both ways to the parameters
(traits changed from code as the notebook's front end would change them)."""

from __future__ import annotations

import os
import signal
import struct
import sys
import time
import zlib

import numpy as np
import pytest

import rxcuda
from rxcuda import Block
from rxcuda.cuda import NullDriver
from rxcuda.view import _widgets

w = pytest.importorskip("ipywidgets", reason="the notebook extra's ipywidgets is not installed")

N = 256


@pytest.fixture
def engine():
    with rxcuda.Engine(driver=NullDriver()) as e:
        yield e


def pipeline(engine):
    mul = engine.add(Block.from_kernel("kernels/scalar_mul.ptx", size=N, name="mul", scale=1.5,
                                       ranges={"scale": (0.0, 4.0, 0.5)}))
    add = engine.add(Block.from_kernel("kernels/vector_add.ptx", size=N, name="add"))
    engine.connect(mul["out"], add["a"])
    engine.write(mul["x"], np.random.default_rng().normal(size=N).astype(np.float32))
    engine.write(add["b"], np.ones(N, np.float32))
    return mul, add


# -- the HTML repr ---------------------------------------------------------------------------------------------
def test_repr_html_shows_state_blocks_timings_memory_and_the_picture(engine):
    mul, add = pipeline(engine)
    before = engine._repr_html_()
    assert "not built" in before and "none yet" in before
    engine.tick()
    page = engine._repr_html_()
    assert "state <span" in page and ">ok<" in page
    assert "frame 1" in page and "last frame:" in page and "us host" in page and "structure" in page
    assert "</span>, 1 rebuild" in page and "1 rebuilds" not in page
    assert "memory:" in page and "buffers in use" in page
    assert "<td>mul</td>" in page and "scale = 1.5" in page and "<td>add</td>" in page
    # no Graphviz here: the DOT text, escaped, folded away
    assert ("<svg" in page) or ("<details>" in page and "digraph" in page and "&lt;" in page)


def test_repr_html_without_dot_says_how_to_get_the_picture(engine, monkeypatch):
    pipeline(engine)
    monkeypatch.setitem(sys.modules, "graphviz", None)
    page = engine._repr_html_()
    assert "pipeline as DOT text" in page and "apt install graphviz" in page


def test_repr_html_of_a_closed_engine():
    engine = rxcuda.Engine(driver=NullDriver())
    engine.close()
    assert "closed after 0 frames" in engine._repr_html_()


def test_the_widgets_count_their_parameters_in_words(engine):
    pipeline(engine)
    one, three = rxcuda.view.widgets(engine, params=["mul.scale"]), rxcuda.view.widgets(engine)
    assert one.box.children[0].value == "<b>1 parameter</b>" and three.box.children[0].value == "<b>3 parameters</b>"
    one.close()
    three.close()


def test_engine_state_says_running_while_run_drives_frames(engine):
    mul, _ = pipeline(engine)
    engine.tick()
    mul.set(scale=2.0)
    from rxcuda.view._notebook import engine_state

    assert engine_state(engine) == "ok"
    running = engine.run(1000)
    try:
        assert engine_state(engine) == "ok, running"
    finally:
        running.dispose()


# -- the widgets ---------------------------------------------------------------------------------------------
def test_a_control_per_parameter_of_the_right_kind(engine):
    mul, add = pipeline(engine)
    ui = rxcuda.view.widgets(engine)
    assert set(ui.controls) == {"mul.scale", "mul.n", "add.n"}
    scale, n = ui.controls["mul.scale"], ui.controls["mul.n"]
    assert isinstance(scale, w.FloatSlider) and (scale.min, scale.max, scale.step, scale.value) == (0, 4, 0.5, 1.5)
    assert isinstance(n, w.IntSlider) and (n.min, n.max, n.value) == (0, N, N)  # a count ends at its limit
    assert "application/vnd.jupyter.widget-view+json" in ui._repr_mimebundle_()
    assert repr(ui) == "<rxcuda.view.Widgets: 3 controls, 0 previews>"
    ui.close()
    assert repr(ui).endswith(", closed>")


def test_moving_a_slider_sets_the_parameter_through_its_checks(engine):
    mul, _ = pipeline(engine)
    ui = rxcuda.view.widgets(engine, params=["mul.scale", mul])
    ui.controls["mul.scale"].value = 2.5
    assert mul.params["scale"].value == 2.5 and ui.message.value == ""
    frame = engine.tick()
    assert frame.tiers == ("structure",) or "parameters" in frame.tiers
    ui.controls["mul.n"].value = 100
    assert mul.params["n"].value == 100
    ui.close()


def test_a_refused_value_shows_the_message_and_the_control_returns(engine):
    mul, add = pipeline(engine)
    free = engine.add(Block.from_kernel("kernels/scalar_mul.ptx", size=N, name="free"))  # scale: no range
    ui = rxcuda.view.widgets(engine, params=[free, "mul.n"])
    box = ui.controls["free.scale"]
    assert isinstance(box, w.FloatText)
    box.value = float("nan")
    assert "free.scale" in ui.message.value and "finite" in ui.message.value
    assert box.value == free.params["scale"].value == 1.0
    # a count past its buffer: the slider's end is stale until the next refresh after a resize
    engine.resize(mul["x"], (64,))
    assert mul.params["n"].limit == 64
    ui.controls["mul.n"].value = 200
    assert "BoundsError" not in ui.message.value and "mul.n = 200" in ui.message.value
    assert ui.controls["mul.n"].value == mul.params["n"].value == N
    ui.refresh()
    assert ui.controls["mul.n"].max == 64
    ui.close()


def test_a_change_from_code_moves_the_slider(engine):
    mul, add = pipeline(engine)
    ui = rxcuda.view.widgets(engine)
    mul.set(scale=3.0)
    assert ui.controls["mul.scale"].value == 3.0
    add.params["n"].value = 17
    assert ui.controls["add.n"].value == 17
    ui.close()
    mul.set(scale=0.5)  # closed: no longer followed
    assert ui.controls["mul.scale"].value == 3.0


def test_a_count_set_past_the_sliders_old_end_widens_it(engine):
    solo = engine.add(Block.from_kernel("kernels/scalar_mul.ptx", size=N, name="solo"))
    engine.write(solo["x"], np.ones(N, np.float32))
    ui = rxcuda.view.widgets(engine)
    assert ui.controls["solo.n"].max == N
    engine.resize(solo["x"], (2 * N,))  # the count's limit grows before the next refresh moves the slider's end
    engine.tick()
    solo.set(n=N + 10)
    assert ui.controls["solo.n"].value == N + 10 and ui.controls["solo.n"].max >= N + 10
    assert solo.params["n"].value == N + 10  # the slider did not clamp it back
    ui.close()


def test_frame_times_and_previews_are_drawn(engine):
    mul, add = pipeline(engine)
    grid = engine.add(Block.from_kernel("kernels/scalar_mul.ptx", size=N, name="grid"))
    engine.resize(grid["x"], (16, 16))
    ui = rxcuda.view.widgets(engine, params=[], previews=[add["out"], grid["out"]], every=1, interval=0.0)
    assert ui.controls == {}
    for _ in range(3):
        engine.tick()
    ui.refresh()
    assert "<polyline" in ui.plot.value and "host" in ui.plot.value
    line, image = ui.previews["add.out"], ui.previews["grid.out"]
    assert isinstance(line, w.HTML) and "<svg" in line.value
    assert isinstance(image, w.Image) and bytes(image.value).startswith(b"\x89PNG")
    ui.close()


def test_widgets_errors(engine, monkeypatch):
    pipeline(engine)
    with pytest.raises(ValueError, match=r"widgets\(params=...\): mul has no parameter 'gain'"):
        rxcuda.view.widgets(engine, params=["mul.gain"])
    with pytest.raises(TypeError, match=r"widgets\(\) shows an rxcuda.Engine or an rxcuda.IsolatedEngine \(got str\)"):
        rxcuda.view.widgets("engine")
    with pytest.raises(ValueError, match=r"every=.*positive int.*got 0"):
        rxcuda.view.widgets(engine, every=0)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    with pytest.raises(rxcuda.view.WidgetsNotFoundError, match=r"pip install '\.\[notebook\]' in rxcuda's checkout"):
        rxcuda.view.widgets(engine)


def test_widgets_of_a_closed_engine():
    engine = rxcuda.Engine(driver=NullDriver())
    engine.close()
    with pytest.raises(rxcuda.EngineClosedError, match="the engine is closed"):
        rxcuda.view.widgets(engine)


def test_png_is_a_valid_image():
    a = np.random.default_rng().uniform(size=(5, 7)).astype(np.float32)
    data = _widgets.png(a)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (7, 5)
    idat = data.index(b"IDAT")
    (length,) = struct.unpack(">I", data[idat - 4:idat])
    raw = zlib.decompress(data[idat + 4:idat + 4 + length])
    rows = np.frombuffer(raw, np.uint8).reshape(5, 8)[:, 1:]
    d = a.astype(np.float64)
    np.testing.assert_array_equal(rows, ((d - d.min()) * (255 / (d.max() - d.min()))).astype(np.uint8))


def test_the_controls_of_an_isolated_engine_set_its_gpu_process_and_survive_a_fault():
    """rxcuda.view.widgets(iso): the parameters live in the user's process, so the controls work as for an Engine;
    each value reaches the GPU process's next frame (checked against NumPy on the CPU device), previews come from
    it, and the same controls keep working after its process was replaced."""
    with rxcuda.IsolatedEngine(device="cpu", deadline=5.0) as iso:
        mul = iso.add(Block.from_kernel("kernels/scalar_mul.ptx", size=N, name="mul"))
        x = np.random.default_rng().standard_normal(N).astype(np.float32)
        iso.write(mul["x"], x)
        assert iso.tick().state == "ok"
        ui = rxcuda.view.widgets(iso, params=["mul.scale"], previews=[mul["out"]], every=1, interval=0.0)
        for scale in (2.5, -0.75):
            ui.controls["mul.scale"].value = scale
            assert iso.tick().state == "ok"
            np.testing.assert_array_equal(iso.read(mul["out"]), x * np.float32(scale))
        mul.set(scale=1.5)  # a change from code moves the slider
        assert ui.controls["mul.scale"].value == 1.5
        ui.controls["mul.scale"].value = float("nan")  # refused by the parameter's checks, here
        assert "finite" in ui.message.value and ui.controls["mul.scale"].value == 1.5
        iso.tick()
        ui.refresh()
        assert "<svg" in ui.previews["mul.out"].value and "<polyline" in ui.plot.value
        pid = iso.pid
        os.kill(pid, signal.SIGKILL)  # the GPU process dies: the controls are the user's, they stay
        deadline = time.monotonic() + 60
        while iso.tick().state != "ok" or iso.pid == pid:
            assert time.monotonic() < deadline, iso.faults[-1:]
        ui.controls["mul.scale"].value = 4.0
        assert iso.tick().state == "ok"
        np.testing.assert_array_equal(iso.read(mul["out"]), x * np.float32(4.0))
        ui.close()

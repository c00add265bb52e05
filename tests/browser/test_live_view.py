"""The live view in headless Chromium against the real server: an engine on the null driver runs a small
pipeline at 60 Hz (a block feeding a composite, a block, a For region, and a delayed connection back), and
``engine.serve()`` shows it. The page finds every block, a slider or number box sets the engine's parameter, a
parameter set from Python moves the controls on every page, an injected diagnostic lands on its block, an
invalid value is refused on the page, and a screenshot is saved (also to $RXCUDA_SCREENSHOT: `make screenshot`
writes docs/live-view.png, the README's picture)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import time
from types import SimpleNamespace

import numpy as np
import pytest

import rxcuda
from rxcuda import Block, Composite
from rxcuda.cuda import NullDriver

ROOT = pathlib.Path(__file__).resolve().parents[2]
N = 4096


def q(value: str) -> str:
    """A CSS attribute value, quoted and escaped."""
    return json.dumps(value)


def pipeline(engine: rxcuda.Engine) -> SimpleNamespace:
    kernel = str(ROOT / "kernels" / "scalar_mul.ptx")
    gain = Composite("gain")  # y = gain * gain * x
    first = gain.add(Block.from_kernel(kernel, size=N, name="first"))
    second = gain.add(Block.from_kernel(kernel, size=N, name="second"))
    gain.connect(first["out"], second["x"])
    gain.expose("x", first["x"])
    gain.expose("y", second["out"])
    gain.expose_parameter("gain", first.params["scale"], second.params["scale"], value=1.5)

    mix = engine.add(Block.from_kernel(str(ROOT / "kernels" / "vector_add.ptx"), size=N, name="mix"))
    stage = engine.add(gain)
    damp = engine.add(Block.from_kernel(kernel, size=N, name="damp", scale=0.5))
    echo = Block.from_kernel(kernel, size=N, name="echo", scale=0.9, ranges={"scale": (0.0, 1.0, 0.05)})
    loop = engine.add(rxcuda.For(3, [echo], name="repeat"))
    engine.connect(mix["out"], stage["x"])
    engine.connect(stage["y"], damp["x"])
    engine.connect(damp["out"], echo["x"])
    engine.connect(echo["out"], mix["b"], delay=1)  # feedback: last frame's echo
    engine.write(mix["a"], np.ones(N, np.float32))
    return SimpleNamespace(mix=mix, stage=stage, damp=damp, echo=echo, loop=loop)


@pytest.fixture(scope="module")
def live(browser):
    engine = rxcuda.Engine(driver=NullDriver())
    blocks = pipeline(engine)
    engine.profile = "per_block"
    engine.tick()
    running = engine.run(60)
    view = engine.serve("127.0.0.1")
    try:
        yield SimpleNamespace(engine=engine, view=view, **vars(blocks))
    finally:
        view.dispose()
        running.dispose()
        engine.close()


def wait_until(page, condition, what: str, timeout: float = 5.0) -> None:
    """Poll ``condition()`` (Python side) until it holds, letting the browser run; fail naming ``what``."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"not within {timeout} s: {what}")
        page.wait_for_timeout(20)


def select_region(page, name: str) -> None:
    """Click a region's label (its body's blocks cover the middle of the group)."""
    page.locator(f"#graph [data-block={q(name)}]").click(position={"x": 24, "y": 10})


def open_view(page, live) -> None:
    page.goto(live.view.url)
    page.wait_for_selector('#conn[data-state="open"]')
    page.wait_for_selector('#graph [data-block="damp"]')


def test_the_page_shows_every_block_link_and_group(page, live):
    from playwright.sync_api import expect

    open_view(page, live)
    names = [b.name for b in live.engine.blocks]
    assert set(names) >= {"mix", "gain/first", "gain/second", "damp", "echo", "repeat"}
    for name in names:
        expect(page.locator(f"#graph [data-block={q(name)}]")).to_have_count(1)
    # the region is a group around its body, the composite a group around its blocks
    assert page.locator('#graph .group.region[data-block="repeat"]').count() == 1
    assert page.locator('#graph [data-composite="gain"]').count() == 1
    # links labelled with dtype and shape; the delayed one dashed
    expect(page.locator("#graph .link")).to_have_count(len(live.engine.connections))
    assert f"f32 [{N}]" in page.locator('#graph [data-link="mix.out->gain/first.x"]').text_content()
    delayed = page.locator("#graph .link.delayed")
    assert delayed.count() == 1 and delayed.get_attribute("data-link") == "echo.out->mix.b"
    # the header is live: frames advance and the frame rate shows
    expect(page.locator("#profile")).to_have_text("per_block")
    first = int(page.text_content("#frame"))
    page.wait_for_function(f"Number(document.getElementById('frame').textContent) > {first + 5}")
    page.wait_for_function("Number(document.getElementById('fps').textContent) > 10")
    # per-block GPU times (zeros on the null driver, which says so) and the status (memory by pool class)
    expect(page.locator('#graph [data-block="damp"] text.gpu')).to_have_text("not measured")
    expect(page.locator("#memory-total")).to_contain_text("reserved")


def test_on_the_null_driver_the_page_says_where_the_numbers_are_that_they_are_not_measured(page, live):
    from playwright.sync_api import expect

    open_view(page, live)
    why = "not measured: the null driver runs nothing on a GPU: its GPU times and port values are zeros"
    expect(page.locator("#plot-note")).to_be_visible()
    expect(page.locator("#plot-note")).to_contain_text(why)  # under the frame-time card's title
    expect(page.locator("#preview-note")).to_contain_text(why)  # the preview's values too
    page.locator('#graph [data-block="damp"]').click()
    expect(page.locator("#block-state")).to_contain_text("(not measured)")
    expect(page.locator('#graph [data-block="damp"] text.gpu')).to_have_text("not measured")


def test_moving_a_slider_sets_the_engine_parameter(page, live):
    from playwright.sync_api import expect

    open_view(page, live)
    page.locator('#graph [data-block="damp"]').click()
    box = page.locator('input[data-param="damp.scale"]')
    box.fill("1.25")
    box.press("Enter")
    wait_until(page, lambda: live.damp.params["scale"].value == 1.25, "damp.scale == 1.25 from the number box")
    slider = page.locator('input[data-slider="damp.scale"]')
    lo, hi = float(slider.get_attribute("min")), float(slider.get_attribute("max"))
    target = lo + 0.25 * (hi - lo)
    slider.evaluate("(e, v) => { e.value = String(v); e.dispatchEvent(new Event('input', {bubbles: true}));"
                    " e.dispatchEvent(new Event('change', {bubbles: true})); }", target)
    wait_until(page, lambda: live.damp.params["scale"].value == pytest.approx(target), "damp.scale from the slider")
    # the box shows the slider's value (a values message still in flight may show the number box's 1.25 first)
    expect(box).to_have_value(page.evaluate("(v) => String(v)", target))
    # an integer parameter (the region's pass count) takes an integer box
    n = page.locator('input[data-param="repeat.n"]')
    select_region(page, "repeat")
    assert page.locator('input[data-slider="repeat.n"]').count() == 0
    n.fill("2")
    n.press("Enter")
    wait_until(page, lambda: live.loop.params["n"].value == 2, "repeat.n == 2 from the integer box")


def test_a_value_set_in_python_or_on_another_page_moves_every_page(page, live, browser):
    from playwright.sync_api import expect

    other = browser.new_context().new_page()
    try:
        open_view(page, live)
        open_view(other, live)
        live.damp.params["scale"].value = 0.75
        for pg in (page, other):
            expect(pg.locator('input[data-param="damp.scale"]')).to_have_value("0.75", timeout=5000)
            expect(pg.locator('input[data-slider="damp.scale"]')).to_have_value("0.75", timeout=5000)
        # a change made on one page shows on the other
        other.locator('#graph [data-block="damp"]').click()
        other.fill('input[data-param="damp.scale"]', "0.625")
        other.press('input[data-param="damp.scale"]', "Enter")
        expect(page.locator('input[data-param="damp.scale"]')).to_have_value("0.625", timeout=5000)
        assert live.damp.params["scale"].value == 0.625
    finally:
        other.context.close()


def test_an_injected_diagnostic_appears_on_its_block_and_in_the_list(page, live):
    from playwright.sync_api import expect

    open_view(page, live)
    live.engine._rt.reporter.warn("echo", "injected by the browser test: look at echo", live.echo)
    expect(page.locator('#graph [data-block="echo"]')).to_have_attribute("data-diagnostics", "1")
    item = page.locator('#diagnostics li[data-diag-block="echo"]')
    expect(item).to_contain_text("injected by the browser test")
    item.click()  # selects its block
    expect(page.locator("#block-title")).to_have_text("echo")
    expect(page.locator("#block-diagnostics")).to_contain_text("injected by the browser test")


def test_an_invalid_value_is_refused_on_the_page_and_changes_nothing(page, live):
    from playwright.sync_api import expect

    open_view(page, live)
    page.locator('#graph [data-block="damp"]').click()
    before = live.damp.params["scale"].value
    box = page.locator('input[data-param="damp.scale"]')
    box.fill("1e39")  # beyond f32
    box.press("Enter")
    refused = page.locator('[data-refused="damp.scale"]')
    expect(refused).to_contain_text("damp.scale")
    expect(box).to_have_value(page.evaluate("(v) => String(v)", before))  # back to the engine's value
    box.fill("1e40")  # refused again: the error is shown once, under its control, and nothing pops up
    box.press("Enter")
    expect(refused).to_contain_text("got 1e+40")
    assert page.locator('[data-refused="damp.scale"]').count() == 1 and page.locator("#toasts .toast").count() == 0
    box.fill("0.5")  # a valid value clears the old error
    box.press("Enter")
    expect(refused).to_have_text("")
    assert live.damp.params["scale"].value == 0.5
    live.damp.params["scale"].value = before
    expect(box).to_have_value(page.evaluate("(v) => String(v)", before))
    # a declared range: the slider spans it, and a value beyond it is refused
    page.locator('#graph [data-block="echo"]').click()
    slider = page.locator('input[data-slider="echo.scale"]')
    assert [slider.get_attribute(a) for a in ("min", "max", "step")] == ["0", "1", "0.05"]
    page.fill('input[data-param="echo.scale"]', "1.5")
    page.press('input[data-param="echo.scale"]', "Enter")
    expect(page.locator('[data-refused="echo.scale"]')).to_contain_text("echo.scale")
    expect(page.locator('input[data-param="echo.scale"]')).to_have_value("0.9")
    select_region(page, "repeat")
    n = page.locator('input[data-param="repeat.n"]')
    n.fill("2.5")  # the pass count is an integer: said in a web page's words
    n.press("Enter")
    expect(page.locator('[data-refused="repeat.n"]')).to_contain_text("takes a whole number (got 2.5)")
    assert "Python" not in page.text_content('[data-refused="repeat.n"]')
    time.sleep(0.1)
    assert live.damp.params["scale"].value == before and isinstance(live.loop.params["n"].value, int)
    assert live.echo.params["scale"].value == 0.9


def test_serve_params_limits_the_controls_and_the_page_cannot_set_others(page, live):
    from playwright.sync_api import expect

    failed = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    with live.engine.serve(params=["damp.scale", live.echo]) as view:
        page.goto(view.url)
        page.wait_for_selector('#conn[data-state="open"]')
        page.check("#all-params")
        expect(page.locator("#params input[data-param]")).to_have_count(3)  # echo: all of its parameters
        assert {page.locator("#params input[data-param]").nth(i).get_attribute("data-param") for i in range(3)} \
            == {"damp.scale", "echo.scale", "echo.n"}
        # a page that sends a set of another parameter anyway: refused, naming it; nothing changes
        before = live.loop.params["n"].value
        said = page.evaluate("""() => new Promise((done) => {
            const ws = new WebSocket(new URL("ws", location.href).href.replace("http", "ws"));
            ws.onopen = () => { ws.send(JSON.stringify({type: "hello", token: ""}));
                ws.send(JSON.stringify({type: "set", block: "repeat", param: "n", value: 1, id: 7})); };
            ws.onmessage = (ev) => { const m = JSON.parse(ev.data); if (m.type === "error") { ws.close(); done(m); } };
        })""")
        assert said["id"] == 7 and said["message"].startswith("repeat.n is not a control of this page")
        assert live.loop.params["n"].value == before
        icon = page.request.get(view.url.split("?")[0] + "favicon.ico")
        assert icon.status == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert failed == []  # the page, its assets and its icon: nothing missing


def test_screenshot(page, live, tmp_path):
    """The page as the README shows it, at 1400 x 900 and at 800 x 600: a selected block with a warning that
    matches its control, the frame-time plot with update marks, and a histogram preview."""
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 1400, "height": 900})
    open_view(page, live)
    page.locator('#graph [data-block="damp"]').click()
    page.click('[data-preview="damp.out:hist"]')
    expect(page.locator("#preview-title")).to_contain_text("damp.out (hist)")
    for v in (0.5, 0.8, 1.2):  # parameter updates mark the frame-time plot
        live.damp.params["scale"].value = v
        page.wait_for_timeout(120)
    live.engine._rt.reporter.warn("damp", "damp.scale is above 1: the feedback grows every frame", live.damp)
    expect(page.locator('input[data-param="damp.scale"]')).to_have_value("1.2")
    expect(page.locator("#block-message")).to_contain_text("above 1")
    target = os.environ.get("RXCUDA_SCREENSHOT")
    first = int(page.text_content("#frame"))  # for the README a second of frames on the plot, else a few
    page.wait_for_function(f"Number(document.getElementById('frame').textContent) > {first + (60 if target else 10)}")
    expect(page.locator("#preview-title")).to_contain_text(f"{N} elements")
    shots = {}
    for size, name in (((1400, 900), "live-view.png"), ((800, 600), "live-view-800.png")):
        page.set_viewport_size({"width": size[0], "height": size[1]})
        page.wait_for_timeout(100)  # the canvases redraw for the new size
        if size[0] == 800:  # readable: the graph is not shrunk below 0.75 (its pane scrolls instead)
            box = page.locator('#graph [data-block="damp"] rect.box').bounding_box()
            assert box["width"] >= 0.75 * 180 - 1, box
        path = tmp_path / name
        page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 20_000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        shots[name] = path
    if target:  # `make screenshot`: docs/live-view.png and, beside it, docs/live-view-800.png
        target_path = pathlib.Path(target)
        if not target_path.is_absolute():
            target_path = ROOT / target_path
        target_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shots["live-view.png"], target_path)
        shutil.copyfile(shots["live-view-800.png"], target_path.with_name(target_path.stem + "-800.png"))

"""The page on its own, against a scripted server (Playwright answers the page's WebSocket and serves the files
from rxcuda/view/static): what the real server rarely sends, such as hostile block names, regions, composites,
histograms and a wrong token. tests/browser/test_live_view.py runs the page against the real engine.serve()."""

from __future__ import annotations

import json
import mimetypes
import pathlib

import pytest

STATIC = pathlib.Path(__file__).resolve().parents[2] / "rxcuda" / "view" / "static"

BASE = "http://view.test"

GRAPH = {
    "type": "graph",
    "blocks": [
        {"id": 1, "name": "src", "state": "ok", "message": "", "kind": "block", "region": None, "composite": None,
         "ports": [{"name": "out", "direction": "out", "dtype": "f32", "shape": [64]}],
         "params": [{"name": "gain", "dtype": "f32", "value": 2.0, "min": 0.0, "max": 10.0, "step": 0.5},
                    {"name": "n", "dtype": "i32", "value": 64, "min": None, "max": None, "step": None},
                    {"name": "on", "dtype": "bool", "value": True, "min": None, "max": None, "step": None}]},
        {"id": 2, "name": '<img src=x onerror="window.pwned=1">', "state": "warning", "message": "<b>hi</b>",
         "kind": "block", "region": None, "composite": "outer/inner",
         "ports": [{"name": "x", "direction": "in", "dtype": "f32", "shape": [64]},
                   {"name": "out", "direction": "out", "dtype": "f32", "shape": [64]}],
         "params": [{"name": "scale", "dtype": "f32", "value": 0.5, "min": None, "max": None, "step": None}]},
        {"id": 3, "name": "loop", "state": "error", "message": "broken", "kind": "region",
         "region": {"kind": "while", "bodies": [["body"]]}, "composite": None,
         "ports": [], "params": []},
        {"id": 4, "name": "body", "state": "ok", "message": "", "kind": "block", "region": None, "composite": None,
         "ports": [{"name": "x", "direction": "in", "dtype": "f32", "shape": [64]}], "params": []},
    ],
    "links": [
        {"src": ["src", "out"], "dst": ['<img src=x onerror="window.pwned=1">', "x"], "dtype": "f32", "shape": [64],
         "bytes": 256, "delay": 0},
        {"src": ['<img src=x onerror="window.pwned=1">', "out"], "dst": ["body", "x"], "dtype": "f32",
         "shape": [64], "bytes": 256, "delay": 1},
    ],
    "layout": {"src": [0, 0], '<img src=x onerror="window.pwned=1">': [260, 0], "loop": [520, 0],
               "body": [520, 40]},
    "width": 720, "height": 120,
}
HOSTILE = GRAPH["blocks"][1]["name"]


def q(value: str) -> str:
    """A CSS attribute value, quoted and escaped (a JSON string is one)."""
    return json.dumps(value)


class Scripted:
    """The server side of the page's WebSocket: answers hello with the given messages, records the rest."""

    def __init__(self, token: str = "", answers=()):
        self.token, self.answers, self.got, self.ws = token, list(answers), [], None

    def __call__(self, ws) -> None:
        self.ws = ws

        def on_message(text) -> None:
            m = json.loads(text)
            self.got.append(m)
            if m["type"] == "hello":
                if m["token"] != self.token:
                    ws.send(json.dumps({"type": "error", "message": "wrong token"}))
                    ws.close(code=4403, reason="wrong token")
                    return
                ws.send(json.dumps({"type": "hello", "version": 1,
                                    "engine": {"device": "scripted", "profile": "per_block", "frame": 7}}))
                for a in self.answers:
                    ws.send(json.dumps(a))

        ws.on_message(on_message)

    def send(self, msg: dict) -> None:
        self.ws.send(json.dumps(msg))


def open_page(page, server: Scripted, query: str = "") -> None:
    def serve(route) -> None:
        path = route.request.url[len(BASE):].split("?")[0]
        name = "index.html" if path == "/" else path.removeprefix("/static/")
        f = STATIC / name
        if "/" in name or not f.is_file():
            route.fulfill(status=404, body="not found")
        else:
            route.fulfill(status=200, body=f.read_bytes(),
                          content_type=mimetypes.guess_type(f.name)[0] or "application/octet-stream")

    page.route(f"{BASE}/**", serve)
    page.route_web_socket(f"{BASE.replace('http', 'ws')}/ws", server)
    page.goto(f"{BASE}/{query}")


@pytest.fixture
def scripted(page):
    server = Scripted(answers=[GRAPH, {"type": "params", "values": {"src.gain": 3.0}}])
    open_page(page, server)
    page.wait_for_selector('#graph [data-block="src"]')
    return server


def test_hostile_names_stay_text_and_groups_are_drawn(page, scripted):
    block = page.locator(f"#graph [data-block={q(HOSTILE)}]")
    assert block.count() == 1
    assert page.evaluate("window.pwned") is None and page.locator("#graph img").count() == 0
    assert block.get_attribute("data-state") == "warning"
    block.click()
    assert page.text_content("#block-title") == HOSTILE
    assert page.text_content("#block-message") == "<b>hi</b>" and page.locator("#block-message b").count() == 0
    # the composite's two levels and the while region around its body, coloured by the region's state
    assert page.locator('[data-composite="outer"]').count() == 1
    assert page.locator('[data-composite="outer/inner"]').count() == 1
    outer = page.locator('[data-composite="outer"] rect').bounding_box()
    inner = page.locator('[data-composite="outer/inner"] rect').bounding_box()
    assert outer["x"] < inner["x"] and outer["x"] + outer["width"] > inner["x"] + inner["width"]  # drawn around
    region = page.locator('#graph .group.region[data-block="loop"]')
    assert region.get_attribute("data-state") == "error" and "while" in region.text_content()
    # a delayed link is dashed and says so
    delayed = page.locator("#graph .link.delayed")
    assert delayed.count() == 1 and "delay 1" in delayed.text_content()
    assert "f32 [64]" in page.locator("#graph .link").first.text_content()


def test_controls_fit_the_parameter_types(page, scripted):
    # a float with min/max/step: a slider over the declared range, the value from the params message
    slider = page.locator('input[data-slider="src.gain"]')
    assert [slider.get_attribute(a) for a in ("min", "max", "step")] == ["0", "10", "0.5"]
    assert slider.input_value() == "3" and page.input_value('input[data-param="src.gain"]') == "3"
    assert page.locator('[data-widen="src.gain"]').count() == 0  # declared: nothing to widen
    # an integer: an integer box, no slider; a bool: a checkbox
    assert page.locator('input[data-slider="src.n"]').count() == 0
    assert page.input_value('input[data-param="src.n"]') == "64"
    assert page.locator('input[data-param="src.on"][type="checkbox"]').is_checked()
    # a float without a range: a span around the value that "widen" doubles
    hostile_scale = f"input[data-slider={q(HOSTILE + '.scale')}]"
    page.locator(f"#graph [data-block={q(HOSTILE)}]").click()
    assert (page.get_attribute(hostile_scale, "min"), page.get_attribute(hostile_scale, "max")) == ("-0.5", "1.5")
    page.click(f"[data-widen={q(HOSTILE + '.scale')}]")
    assert (page.get_attribute(hostile_scale, "min"), page.get_attribute(hostile_scale, "max")) == ("-1.5", "2.5")


def test_a_set_goes_out_and_a_refusal_lands_next_to_its_control(page, scripted):
    def sent_set(value) -> dict:
        page.wait_for_timeout(50)  # let the message leave
        sets = [m for m in scripted.got if m["type"] == "set"]
        assert sets and {k: sets[-1][k] for k in ("block", "param", "value")} == {"block": "src", "param": "n",
                                                                                  "value": value}, sets
        return sets[-1]

    box, refused = page.locator('input[data-param="src.n"]'), page.locator('[data-refused="src.n"]')
    box.fill("100")
    box.press("Enter")
    first = sent_set(100)
    scripted.send({"type": "error", "message": "src.n (i32) must be within [0, 64] (got 100)", "id": first["id"]})
    page.wait_for_function("document.querySelector('[data-refused=\"src.n\"]').textContent.includes('got 100')")
    assert box.input_value() == "64"  # back to the engine's value
    # refused again: shown once, in place of the old error, and never as a pop-up
    box.fill("200")
    box.press("Enter")
    again = sent_set(200)
    assert again["id"] != first["id"]
    scripted.send({"type": "error", "message": "src.n (i32) must be within [0, 64] (got 200)", "id": again["id"]})
    page.wait_for_function("document.querySelector('[data-refused=\"src.n\"]').textContent.includes('got 200')")
    assert "got 100" not in refused.text_content() and page.locator("#toasts .toast").count() == 0
    # a valid value: its ack clears the error
    box.fill("32")
    box.press("Enter")
    ok = sent_set(32)
    scripted.send({"type": "ack", "id": ok["id"], "frame": 9})
    page.wait_for_function("document.querySelector('[data-refused=\"src.n\"]').textContent === ''")
    # an error that names no set is one pop-up; the same again counts up instead of piling
    for _ in range(3):
        scripted.send({"type": "error", "message": "too many messages: at most 200 a second"})
    page.wait_for_function("document.querySelector('#toasts .toast') && "
                           "document.querySelector('#toasts .toast').textContent.includes('\u00d73')")
    assert page.locator("#toasts .toast").count() == 1
    # text that is no number is refused on the page and never sent
    before = len(scripted.got)
    box.fill("ten")
    box.press("Enter")
    assert "is not a number" in refused.text_content()
    assert [m for m in scripted.got[before:] if m["type"] == "set"] == []


def test_frames_status_and_previews(page, scripted):
    scripted.send({"type": "frames", "frames": [[i, 100.0 + i, 80.0] for i in range(8, 40)], "fps": 59.9,
                   "marks": [[20, "structure"], [30, "reload"]], "blocks": {"src": 12.5}})
    page.wait_for_function("document.getElementById('fps').textContent === '59.9'")
    assert page.text_content("#frame") == "39"
    assert page.text_content('#graph [data-block="src"] text.gpu') == "12.5 us"
    # a hello without "measured" (a real device) shows the numbers as they are, with no note
    assert page.locator("#plot-note").is_hidden() and page.locator("#preview-note").is_hidden()
    scripted.send({"type": "status", "rebuilds": 3, "stats": "buffers: 4",
                   "memory": {"bytes_reserved": 3 << 20, "by_class": [[4096, 2, 1]]},
                   "appends": {"src.out": {"count": 70, "capacity": 64, "overflowed": True}}})
    page.wait_for_function("document.getElementById('rebuilds').textContent === '3'")
    assert "3.0 MiB" in page.text_content("#memory-total")
    assert page.locator('tr[data-append="src.out"].overflowed').count() == 1
    page.locator('#graph [data-block="src"]').click()
    page.click('[data-preview="src.out:hist"]')
    page.wait_for_timeout(100)
    assert {"type": "preview", "block": "src", "port": "out", "kind": "hist"} in scripted.got
    scripted.send({"type": "preview", "block": "src", "port": "out", "kind": "hist",
                   "data": {"edges": list(range(33)), "counts": [i % 5 for i in range(32)]}})
    # the histogram's bars are drawn: the canvas has blue pixels
    page.wait_for_function("""(() => { const c = document.getElementById('preview');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        for (let i = 0; i < d.length; i += 4) if (d[i + 2] > 150 && d[i] < 120) return true; return false; })()""")
    page.click("#preview-stop")
    page.wait_for_timeout(100)
    assert {"type": "unpreview", "block": "src", "port": "out"} in scripted.got


def test_a_diagnostic_lands_on_its_block_and_selects_it(page, scripted):
    scripted.send({"type": "diagnostic", "severity": "warning", "subject": "src", "message": "too hot",
                   "frame": 9, "block": "src"})
    item = page.locator('#diagnostics li[data-diag-block="src"]')
    item.wait_for()
    assert "too hot" in item.text_content()
    assert page.get_attribute('#graph [data-block="src"]', "data-diagnostics") == "1"
    item.click()
    assert page.text_content("#block-title") == "src"
    assert "too hot" in page.text_content("#block-diagnostics")


def test_the_token_travels_in_hello_and_a_wrong_one_is_not_retried(page):
    server = Scripted(token="s3cret")
    open_page(page, server, "?token=wrong")
    page.wait_for_function("document.getElementById('conn').textContent.includes('refused')")
    assert server.got[0] == {"type": "hello", "token": "wrong"}
    page.wait_for_timeout(650)  # a refused page does not knock again (a closed one would after 500 ms)
    assert [m["type"] for m in server.got] == ["hello"]


def test_a_graph_with_only_new_states_keeps_the_controls(page, scripted):
    """The server sends the graph again when a block's state changes: the picture's states change, and the
    controls stay the same elements (a slider being dragged is not replaced under the pointer)."""
    from playwright.sync_api import expect

    page.evaluate("document.querySelector('input[data-param=\"src.n\"]').dataset.kept = 'yes'")
    changed = json.loads(json.dumps(GRAPH))
    changed["blocks"][0].update(state="error", message="launch failed")
    scripted.send(changed)
    expect(page.locator('#graph [data-block="src"]')).to_have_attribute("data-state", "error")
    assert page.text_content('#graph [data-block="src"] text.msg') == "launch failed"
    assert page.get_attribute('input[data-param="src.n"]', "data-kept") == "yes"
    # a new structure redraws: a block more, its controls with it
    changed["blocks"].append({"id": 5, "name": "extra", "state": "ok", "message": "", "kind": "block",
                              "region": None, "composite": None, "ports": [],
                              "params": [{"name": "k", "dtype": "u32", "value": 3, "min": 1, "max": 8, "step": 1}]})
    scripted.send(changed)
    expect(page.locator('#graph [data-block="extra"]')).to_have_count(1)
    assert page.input_value('input[data-slider="extra.k"]') == "3"  # an integer with a declared range: a slider
    assert page.get_attribute('input[data-param="src.n"]', "data-kept") is None


def test_the_page_reconnects_when_the_socket_closes(page, scripted):
    from playwright.sync_api import expect

    scripted.ws.close(code=1011, reason="server restarted")
    for _ in range(100):  # the first retry comes after half a second
        if [m["type"] for m in scripted.got].count("hello") == 2:
            break
        page.wait_for_timeout(50)
    assert [m["type"] for m in scripted.got].count("hello") == 2, "the page did not say hello again"
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    expect(page.locator('#graph [data-block="src"]')).to_have_count(1)


def test_each_block_says_its_device_when_the_engine_has_several(page):
    import copy

    graph = copy.deepcopy(GRAPH)
    for b, device in zip(graph["blocks"], (0, 1, 1, 1), strict=True):
        b["device"] = device
    graph["devices"] = 2
    open_page(page, Scripted(answers=[graph]))
    page.wait_for_selector('#graph [data-block="src"]')
    assert page.text_content('#graph .block[data-block="src"] text.device') == "device 0"
    assert page.text_content(f"#graph .block[data-block={q(HOSTILE)}] text.device") == "device 1"
    assert "device 1" in page.text_content('#graph .group.region[data-block="loop"]')  # a region as a whole
    page.locator('#graph [data-block="src"]').click()
    assert "on device 0" in page.text_content("#block-state")
    # a graph of one device: no labels (the same blocks, "devices": 1)
    graph["devices"] = 1
    open_page(page, Scripted(answers=[graph]))
    page.wait_for_selector('#graph [data-block="src"]')
    assert page.locator("#graph text.device").count() == 0

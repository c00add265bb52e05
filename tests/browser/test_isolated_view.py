"""The live page of an isolated engine (``IsolatedEngine.serve()``) in headless Chromium, on the CPU device (its
kernels really run, and a write past a buffer really ends the GPU process): the page shows the pipeline and says
which figures the GPU process does not report, its number box sets the parameter in the GPU process (the output
checked against NumPy), and through a real fault and the process's replacement the page stays connected, lists
the error diagnostic and goes on with the frames."""

from __future__ import annotations

import time

import numpy as np
from test_live_view import wait_until

import rxcuda
from rxcuda.distributed import IsolatedEngine

N = 4096
BAD = ('extern "C" __global__ void bad(const float* x, float* out, int n) '
       "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i + 100000000] = x[i]; }")


def test_the_isolated_page_sets_parameters_in_the_child_and_stays_connected_through_a_fault(page):
    from playwright.sync_api import expect

    x = np.random.default_rng().standard_normal(N).astype(np.float32)
    with IsolatedEngine(device="cpu", deadline=30.0) as iso:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=N, scale=2.0, name="mul"))
        iso.write(mul["x"], x)
        assert iso.tick().state == "ok"
        with iso.serve() as view:
            page.goto(view.url)
            page.wait_for_selector('#conn[data-state="open"]')
            page.wait_for_selector('#graph [data-block="mul"]')
            expect(page.locator("#device")).to_contain_text(f"in process {iso.pid} (isolated)")
            expect(page.locator("#rebuilds")).to_have_text("not measured")
            expect(page.locator("#status-unmeasured")).to_contain_text("append counters")

            box = page.locator('input[data-param="mul.scale"]')
            box.fill("-0.75")
            box.press("Enter")
            wait_until(page, lambda: mul.params["scale"].value == -0.75, "mul.scale == -0.75 from the number box")
            iso.tick()
            np.testing.assert_allclose(iso.read(mul["out"]), np.float32(-0.75) * x, rtol=1e-6)

            first = iso.pid
            oops = iso.add(rxcuda.Block.from_kernel(rxcuda.compile_cuda(BAD, target="ptx"), size=N))
            iso.write(oops["x"], x)
            faulted = iso.tick()
            assert faulted.state == "error"
            expect(page.locator('#diagnostics li[data-severity="error"]')).to_contain_text("illegal address")
            iso.remove(oops)
            end = time.monotonic() + 60
            while iso.tick().state != "ok":
                assert time.monotonic() < end, "no good frame within 60 s"
                page.wait_for_timeout(5)
            assert iso.pid != first
            for _ in range(5):
                iso.tick()
            page.wait_for_function(f"Number(document.getElementById('frame').textContent) > {faulted.index + 1}")
            expect(page.locator("#conn")).to_have_attribute("data-state", "open")  # never dropped
            expect(page.locator("#device")).to_contain_text(f"in process {first} (isolated)")  # the hello's
            expect(page.locator('#graph [data-block="mul"]')).to_have_attribute("data-state", "ok")
            np.testing.assert_allclose(iso.read(mul["out"]), np.float32(-0.75) * x, rtol=1e-6)


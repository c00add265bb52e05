"""``rxcuda demo --serve``: the quickstart pipeline at 60 Hz, served as a live web page (``rxcuda._cli`` parses the
command line and calls :func:`serve_demo`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ._cli import build_demo, demo_inputs
from .model._words import counted


def serve_demo(kernels: Path, args, *, null: bool, why: str = "", out: TextIO | None = None,
               engine_factory: Callable | None = None) -> int:
    """``rxcuda demo --serve``: the quickstart pipeline at 60 Hz, served as a live web page until Ctrl-C or
    ``--seconds``. ``null``: on the null driver (``--plan``), so the page and its controls work without a device;
    ``why``: why there is no GPU (then the CPU device computes). On a device the pipeline runs in an
    :class:`~rxcuda.IsolatedEngine` (a kernel that faults costs frames, not the session), or with ``--in-process``
    in :class:`~rxcuda.Engine` (per-block GPU times on the page; a fault ends this process's GPU). The address is
    printed (with its token on a non-local ``--host``)."""
    import secrets
    import time

    from .view._serve import LOCAL_HOSTS

    out = out or sys.stdout
    if engine_factory is None:
        from .engine._engine import Engine

        if null:
            from .cuda._null import NullDriver

            def engine_factory():
                return Engine(driver=NullDriver(), profile=args.profile)
        elif getattr(args, "in_process", False):
            def engine_factory():
                return Engine(device="cpu" if why else None, profile=args.profile)
        else:
            from .distributed._isolated import IsolatedEngine

            def engine_factory():
                return IsolatedEngine(device="cpu" if why else None)
    token = None if args.host in LOCAL_HOSTS else secrets.token_urlsafe(24)
    a, b = demo_inputs(args.size)
    with engine_factory() as engine:
        frames = [0]
        counting = engine.frames.subscribe(lambda f: frames.__setitem__(0, frames[0] + (f.state == "ok")))
        _add, mul, _above = build_demo(engine, kernels, args.size, a, b)
        with engine.serve(host=args.host, port=args.port, token=token) as view:
            if null:
                where = "the planned pipeline on the null driver (no GPU work)"
            elif hasattr(engine, "faults"):  # an IsolatedEngine
                where = (f"{'the CPU device' if engine.device_index == 'cpu' else f'GPU {engine.device_index}'} "
                         "in a child process (a kernel that faults costs frames, not this session; --in-process "
                         "serves from this process)")
            else:
                where = engine.device.name
            print(f"rxcuda demo --serve: vector_add -> scalar_mul -> append_above, {args.size} elements, "
                  f"60 Hz on {where}", file=out)
            if why:
                print(f"(no CUDA device: {why}; the CPU device computes)", file=out)
            print(f"live view: {view.url}", file=out, flush=True)
            if token:
                print("the address carries the token: share it only with whom may drive this engine", file=out)
            running = engine.run(60)
            try:
                deadline = None if args.seconds is None else time.monotonic() + args.seconds
                while deadline is None or time.monotonic() < deadline:
                    time.sleep(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic())))
            finally:
                running.dispose()
        counting.dispose()
        print(f"served {counted(frames[0], 'frame')}; scale ended at {mul.params['scale'].value}", file=out)
    return 0

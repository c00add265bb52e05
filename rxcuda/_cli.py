"""The ``rxcuda`` command: ``info``, ``demo``, ``plot``, ``examples``, ``kernels build`` and ``cache`` (also
``python -m rxcuda``).

``demo`` runs the quickstart pipeline on the GPU; without one it prints the pipeline the planner would
build, so what the engine does can be read on any machine. ``demo --serve`` runs it at 60 Hz as a live web
page (on the null driver with ``--plan`` or without a GPU).

This module is the one place in the package that prints. A mistake in what the user typed, or an error
rxcuda raises on purpose, ends a command with one line on stderr and exit status 2, never a traceback. When
the reader of its output goes away (``rxcuda demo | head -1``), a command stops quietly with status 141, as
command-line tools killed by SIGPIPE do.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import numpy as np

from .model._words import counted

# The quickstart pipeline: (a + b) -> vector_add -> scalar_mul(scale) -> append_above(threshold).
SCALES = (3.0, 0.5, -2.0, 1.25, 10.0, 0.1)
THRESHOLD = 2.0
SEGMENT = 50  # frames between hot updates of 'scale'
SCALE_RANGE = (-10.0, 10.0, 0.01)  # what the live view's slider spans (demo --serve)
THRESHOLD_RANGE = (-5.0, 5.0, 0.01)
MAX_REL_ERROR = 1e-6


MAX_SIZE = 2**31 - 1  # the demo's kernels take their element count as an i32
EXIT_ERROR = 2
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a tool that SIGPIPE ended


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rxcuda`` console script; returns the exit status.

    0: done; 1: the command ran and found a problem (the demo's results disagree with NumPy); 2: a usage error
    or an error rxcuda raised (one line on stderr); 130: interrupted; 141: the output's reader went away."""
    from .model._errors import RxcudaError

    parser = _parser()
    args = parser.parse_args(argv)  # usage errors exit 2 with one line (_Parser.error)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_ERROR
    command = getattr(args, "command", parser.prog)
    try:
        status = int(func(args) or 0)
        sys.stdout.flush()  # a reader that went away shows here, while BrokenPipeError is still caught
        return status
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout is gone (rxcuda demo | head -1): stop without a word. Python ignores SIGPIPE
        # (its sockets need EPIPE; the live view's server too), so the write raised instead of ending the
        # process; stdout now points at /dev/null so that flushing it at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # a stdout with no file descriptor has nothing left to flush
            pass
        finally:
            os.close(devnull)
        return EXIT_BROKEN_PIPE
    # Errors raised on purpose, bad values and files, and a lack of memory are the user's to act on:
    # their message is the whole report. Anything else is a bug, and its traceback is what to report.
    except (RxcudaError, ValueError, OSError, MemoryError) as e:
        print(f"{command}: error: {one_line(e)}", file=sys.stderr)
        return EXIT_ERROR


def one_line(e: BaseException) -> str:
    """An exception's message on one line (a compiler log's lines joined with '; ')."""
    text = "; ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())
    if not text or isinstance(e, MemoryError):
        text = f"{type(e).__name__}{': ' + text if text else ''} (not enough host memory)"
    return text


class _Parser(argparse.ArgumentParser):
    """argparse with a usage error on one line, ``rxcuda demo: error: ... (see 'rxcuda demo --help')``, and
    exit status 2. Subcommand parsers are of the same class."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(
        prog="rxcuda",
        description="Reactive dataflow runtime for CUDA: one CUDA graph per frame, cheapest-legal updates.",
    )
    parser.add_argument("--version", action="version", version=f"rxcuda {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    info = sub.add_parser("info", help="driver, devices and versions of the CUDA Python stack")
    info.set_defaults(func=_cmd_info, command=info.prog)

    demo = sub.add_parser(
        "demo",
        help="run the quickstart pipeline and check it against NumPy (without a GPU: print its plan)",
        description="vector_add -> scalar_mul(scale) -> append_above(threshold), run for a few hundred "
        f"frames; 'scale' changes every {SEGMENT} frames through hot updates. Without a CUDA device, "
        "prints the planned graph instead.",
    )
    demo.add_argument("--frames", type=_positive_int, default=300, help="frames to run (default 300)")
    demo.add_argument("--size", type=_size, default=1 << 16,
                      help=f"elements per buffer, 1 to {MAX_SIZE} (default 65536)")
    demo.add_argument("--plan", action="store_true", help="only print the planned pipeline, even with a GPU")
    demo.add_argument("--kernels", type=Path, default=None, metavar="DIR",
                      help="folder with vector_add, scalar_mul and append_above (.ptx + .json); default: "
                      "$RXCUDA_KERNELS, else the kernels shipped with rxcuda")
    demo.add_argument("--dot", type=Path, default=None, metavar="FILE",
                      help="also write a picture of the pipeline to FILE: DOT text for .dot (needs nothing), "
                      ".svg/.png/.pdf through Graphviz, DOT text on standard output for - (the report then goes "
                      "to standard error: rxcuda demo --plan --dot - | dot -Tsvg > demo.svg); after a GPU run it "
                      "shows each block's state")
    live = demo.add_argument_group("live view (needs aiohttp: pip install '.[view]')")
    live.add_argument("--serve", action="store_true",
                      help="run the pipeline at 60 Hz and serve it as a live web page (print its address); "
                      "without a GPU on the CPU device, with --plan on the null driver")
    live.add_argument("--host", default=None,
                      help="interface for --serve (default 127.0.0.1; any other needs the token printed)")
    live.add_argument("--port", type=_port, default=None, help="port for --serve (default 0: a free one)")
    live.add_argument("--seconds", type=_positive_float, default=None, metavar="N",
                      help="stop serving after N seconds (default: until Ctrl-C)")
    live.add_argument("--profile", default=None, metavar="LEVEL",
                      help="profiling level while serving in-process (none, summary, per_block, ...; default "
                      "per_block); needs --in-process")
    live.add_argument("--in-process", dest="in_process", action="store_true", default=None,
                      help="serve from rxcuda.Engine in this process instead of an IsolatedEngine (the default with "
                      "a device: its GPU side runs in a child process, so a kernel that faults costs frames, not "
                      "the session); in-process, the page shows per-block GPU times, and a fault ends this "
                      "process's GPU")
    demo.set_defaults(func=_cmd_demo, command=demo.prog)

    plot = sub.add_parser(
        "plot",
        help="draw host and GPU time per frame of a trace (engine.trace) into a picture (needs matplotlib)",
        description="Host and GPU time per frame of a trace written by engine.trace(path), with a mark at each "
        "update (coloured by tier), reload and diagnostic: what to look at to find a stutter. Needs "
        "matplotlib: pip install '.[view]'.",
    )
    plot.add_argument("trace", type=Path, metavar="TRACE", help="a trace-event JSON file written by engine.trace")
    plot.add_argument("-o", "--output", type=Path, default=None, metavar="PICTURE",
                      help="the picture to write: .png, .svg, .pdf or .jpg (default: TRACE with .png)")
    scale = plot.add_mutually_exclusive_group()
    scale.add_argument("--log", dest="log", action="store_true", default=None, help="log-scale time axis")
    scale.add_argument("--linear", dest="log", action="store_false",
                       help="linear time axis (default: log when the slowest frame dwarfs the median)")
    plot.add_argument("--title", default=None, help="the picture's title (default: the device)")
    plot.set_defaults(func=_cmd_plot, command=plot.prog)

    examples = sub.add_parser(
        "examples", help="list the examples shipped with rxcuda, or run one: rxcuda examples NAME [ARGS]",
        description="The examples shipped with rxcuda (the package rxcuda.examples). Without NAME, list them; "
        "with NAME, run that one with ARGS, as python -m rxcuda.examples.NAME ARGS does.")
    examples.add_argument("name", nargs="?", metavar="NAME", help="the example to run")
    examples.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="its arguments")
    examples.set_defaults(func=_cmd_examples, command=examples.prog)

    _add_build_commands(sub)
    return parser


def _add_build_commands(subparsers) -> None:
    """``kernels build [DIR]`` and ``cache clear`` / ``cache info`` (rxcuda.sources._build does the work)."""
    kernels = subparsers.add_parser("kernels", help="build kernel files (.cu -> .ptx + .json sidecar)")
    ksub = kernels.add_subparsers(title="kernels commands", metavar="COMMAND")
    build = ksub.add_parser("build", help="compile each .cu in DIR to .ptx (and .cubin) with a .json sidecar")
    build.add_argument("directory", nargs="?", default="kernels", help="kernels folder (default: ./kernels)")
    build.add_argument("--cubin", metavar="ARCH", default=None, help="also build cubins, e.g. --cubin sm_90")
    build.add_argument("--nvrtc", action="store_true", help="compile with NVRTC even where nvcc is present")
    build.add_argument("--no-triton", action="store_true", help="skip *.triton.py files")
    build.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    build.set_defaults(func=_cmd_kernels_build, command=build.prog)
    kernels.set_defaults(func=_help(kernels), command=kernels.prog)

    cache = subparsers.add_parser("cache", help="the compile cache (RXCUDA_CACHE_DIR)")
    csub = cache.add_subparsers(title="cache commands", metavar="COMMAND")
    clear = csub.add_parser("clear", help="delete every cached compile")
    clear.set_defaults(func=_cmd_cache_clear, command=clear.prog)
    info = csub.add_parser("info", help="where the cache is and how big")
    info.set_defaults(func=_cmd_cache_info, command=info.prog)
    cache.set_defaults(func=_help(cache), command=cache.prog)


def _help(parser: argparse.ArgumentParser) -> Callable:
    """A command that prints ``parser``'s help and fails (``rxcuda kernels`` without a subcommand)."""

    def show(_args) -> int:
        parser.print_help()
        return EXIT_ERROR

    return show


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive int (got {text!r})") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive int (got {value})")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, 0 to 65535 (got {text!r})") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number, 0 to 65535 (got {value})")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds (got {text!r})") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds (got {text})")
    return value


def _size(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SIZE}, the largest element count the demo's "
                                         f"kernels take (got {value})")
    return value


# -- info ---------------------------------------------------------------------------------------------------
def _cmd_info(args, out: TextIO | None = None) -> int:
    from . import __version__, device_info

    out = out or sys.stdout
    info = device_info()
    print(f"rxcuda {__version__} on Python {platform.python_version()} ({sys.platform})", file=out)
    if "error" in info:
        print(f"no CUDA device: {info['error']}", file=out)
    else:
        print(f"driver: CUDA {info['driver_cuda']}", file=out)
        for d in info["devices"]:
            print(f"device {d['ordinal']}: {d['name']}, compute capability {d['compute_capability']}, "
                  f"{d['memory_gib']} GiB", file=out)
    print("CUDA Python stack:", file=out)
    width = max(len(k) for k in info["versions"])
    for dist, version in info["versions"].items():
        print(f"  {dist:<{width}}  {version}", file=out)
    return 0


# -- plot ---------------------------------------------------------------------------------------------------
def _cmd_plot(args, out: TextIO | None = None) -> int:
    from .view._plot import plot_frames
    from .view._trace import read_trace, summarize

    out = out or sys.stdout
    data = read_trace(args.trace)
    target = args.output if args.output is not None else args.trace.with_suffix(".png")
    plot_frames(data, target, log=args.log, title=args.title)
    print(f"wrote {target}: {summarize(data)}", file=out)
    return 0


# -- examples -----------------------------------------------------------------------------------------------
def _cmd_examples(args, out: TextIO | None = None) -> int:
    from . import examples

    if args.name is None:
        out = out or sys.stdout
        width = max(len(n) for n in examples.names())
        print("the examples shipped with rxcuda (run one: rxcuda examples NAME [ARGS], or python -m "
              "rxcuda.examples.NAME [ARGS]):", file=out)
        for name in examples.names():
            print(f"  {name:<{width}}  {examples.describe(name)}", file=out)
        return 0
    examples.run(args.name, args.args)  # an example that cannot run exits with its reason (SystemExit)
    return 0


# -- kernels build, cache ------------------------------------------------------------------------------------
def _cmd_kernels_build(args, out: TextIO | None = None) -> int:
    from .sources._build import build_folder

    out = out or sys.stdout
    result = build_folder(args.directory, args.cubin, use_nvcc=False if args.nvrtc else None,
                          triton=not args.no_triton, report=None if args.quiet else lambda m: print(m, file=out))
    for failure in result.failures:
        print(f"{args.command}: error: {failure.summary()}", file=sys.stderr)
    if result.failures:
        print(f"{args.command}: {len(result.failures)} source(s) failed; {len(result.outputs)} file(s) up to "
              f"date in {args.directory}", file=sys.stderr)
        return EXIT_ERROR
    if not args.quiet:
        print(f"{len(result.outputs)} file(s) up to date in {args.directory}", file=out)
    return 0


def _cmd_cache_clear(args, out: TextIO | None = None) -> int:
    from .sources._build import clear_cache

    d = clear_cache()
    print(f"cleared {d}" if d else "the compile cache is disabled", file=out or sys.stdout)
    return 0


def _cmd_cache_info(args, out: TextIO | None = None) -> int:
    from .sources._nvrtc import cache_info

    info = cache_info()
    print(f"directory: {info['directory']}\nentries:   {info['entries']}\nsize:      {info['bytes'] / 1024:.1f} "
          "KiB\noverride with RXCUDA_CACHE_DIR", file=out or sys.stdout)
    return 0


# -- demo ---------------------------------------------------------------------------------------------------
DEMO_KERNELS = ("vector_add", "scalar_mul", "append_above")


def find_kernels(explicit: Path | None = None) -> Path:
    """The folder holding the demo's kernels: ``explicit`` (``--kernels DIR``), else ``$RXCUDA_KERNELS``,
    else the kernels shipped with rxcuda.

    The shipped kernels are the package ``rxcuda.kernels`` (the repository's ``kernels/``); a folder given
    needs each kernel's ``.ptx`` and its ``.json`` sidecar."""
    if explicit is not None:
        candidates: list[Path] = [explicit]
    elif os.environ.get("RXCUDA_KERNELS"):
        candidates = [Path(os.environ["RXCUDA_KERNELS"])]
    else:
        candidates = [_shipped_kernels()]
    for c in candidates:
        if c is not None and all((c / f"{k}.ptx").is_file() for k in DEMO_KERNELS):
            # without its sidecar a kernel's parameters are arg0, arg1, ...: the demo could not set 'scale'
            missing = [k for k in DEMO_KERNELS if not (c / f"{k}.json").is_file()]
            if missing:
                raise FileNotFoundError(
                    f"{c / (missing[0] + '.json')}: no such file; the demo needs the sidecar beside each kernel "
                    f"(it names the parameters the demo sets); the shipped one is "
                    f"{_shipped_kernels() / (missing[0] + '.json')}")
            return c
    tried = ", ".join(str(c) for c in candidates if c is not None)
    names = ", ".join(f"{k}.ptx" for k in DEMO_KERNELS)
    raise FileNotFoundError(f"the demo's kernels ({names}) are not in {tried}; pass --kernels DIR")


def _shipped_kernels() -> Path:
    from . import kernels

    return kernels.path(DEMO_KERNELS[0]).parent


def demo_blocks(kernels: Path, size: int):
    """The quickstart blocks and their connections: (add, mul, above), [(src port, dst port), ...]."""
    from .blocks._blocks import Block

    add = Block.from_kernel(kernels / "vector_add.ptx", size=size)
    mul = Block.from_kernel(kernels / "scalar_mul.ptx", size=size, scale=SCALES[0], ranges={"scale": SCALE_RANGE})
    above = Block.from_kernel(kernels / "append_above.ptx", size=size, threshold=THRESHOLD,
                              ranges={"threshold": THRESHOLD_RANGE})
    connections = [(add["out"], mul["x"]), (mul["out"], above["values"])]
    return (add, mul, above), connections


def build_demo(engine, kernels: Path, size: int, a: np.ndarray, b: np.ndarray):
    """The quickstart pipeline added to ``engine``, connected, its inputs ``a`` and ``b`` written: (add, mul,
    above)."""
    (add, mul, above), connections = demo_blocks(kernels, size)
    for blk in (add, mul, above):
        engine.add(blk)
    for src, dst in connections:
        engine.connect(src, dst)
    engine.write(add["a"], a)
    engine.write(add["b"], b)
    return add, mul, above


def plan_demo(kernels: Path, size: int):
    """The demo pipeline as the planner sees it: (blocks, PipelineDescription, GraphPlan).

    Built the way the engine snapshots its model; the inputs the demo writes from the host are 'fed'."""
    from .model._describe import BlockEntry, Connection, PipelineDescription, PortRef
    from .plan._plan import plan

    blocks, connections = demo_blocks(kernels, size)
    add = blocks[0]
    desc = PipelineDescription(
        blocks=tuple(BlockEntry(b.id, b.description, b.values(), b.launches()) for b in blocks),
        connections=tuple(Connection(PortRef(s.block.id, s.name), PortRef(d.block.id, d.name))
                          for s, d in connections),
        bindings={},
        fed=frozenset(PortRef(add.id, p) for p in ("a", "b")),
    )
    return blocks, desc, plan(desc)


def format_plan(blocks, gp, fed=frozenset()) -> str:
    """A person's view of a graph plan: blocks, nodes with dependencies, buffers, parameter tiers."""
    lines = ["blocks:"]
    for b in blocks:
        ports = ", ".join(f"{p.direction} {p.name}: {p.dtype}[{p.count}]" + (" (append)" if p.counter else "")
                          for p in b.description.ports)
        lines.append(f"  {b.name}: {ports}")
    lines.append(f"graph nodes ({len(gp.nodes)}, in launch order):")
    for n in gp.nodes:
        after = ", ".join(f"#{d} {gp.nodes[d].label}" for d in gp.deps[n.id]) or "nothing"
        kind = type(n).__name__.removesuffix("NodePlan").lower()
        extra = ""
        if hasattr(n, "launch"):
            extra = f", grid {n.launch.grid[0]} x block {n.launch.block[0]}"
        lines.append(f"  #{n.id} {kind} {n.label}{extra}; after {after}")
    names = {b.id: b.name for b in blocks}
    ports: dict[int, list[str]] = {}
    for ref, bid in gp.port_buffers.items():
        ports.setdefault(bid, []).append(f"{names.get(ref.block, ref.block)}.{ref.port}")
    lines.append(f"buffers ({len(gp.buffers)}, {sum(b.nbytes for b in gp.buffers)} bytes in all):")
    for buf in gp.buffers:
        shared = ports.get(buf.id, [])
        kind = _BUFFER_KINDS.get(buf.kind, buf.kind)
        if any(ref in fed for ref, bid in gp.port_buffers.items() if bid == buf.id):
            kind += ", written from the host (engine.write)"
        if len(shared) > 1:
            kind += f", shared by {' and '.join(shared)}"
        lines.append(f"  {buf.label}: {buf.dtype}[{buf.count}], {buf.nbytes} bytes, {kind}")
    lines.append("parameters (how a change reaches the GPU):")
    for b in blocks:
        for name, prm in b.params.items():
            lines.append(f"  {b.name}.{name} = {prm.value!r} ({prm.dtype}): {gp.route_of(b.id, name)}")
    return "\n".join(lines)


_BUFFER_KINDS = {
    "port": "engine-owned",
    "external": "the user's array",
    "zeros": "engine-owned, zeroed (optional input left open)",
    "counter": "append counter, zeroed every frame",
    "internal": "engine-owned, inside the block",
    "device_scalar": "device scalar", "mapped": "host-mapped, read by the host after a frame (a While's passes left)",
}


SERVE_DEFAULTS = {"host": "127.0.0.1", "port": 0, "seconds": None, "profile": "per_block", "in_process": False}


def _cmd_demo(args, out: TextIO | None = None, engine_factory: Callable | None = None) -> int:
    # with --dot -, standard output carries the DOT text alone (for a pipe into Graphviz): the report goes to stderr
    out = out or (sys.stderr if str(getattr(args, "dot", None)) == "-" else sys.stdout)
    if not getattr(args, "serve", False):
        given = [f"--{k}" for k in SERVE_DEFAULTS if getattr(args, k, None) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} with --serve; add "
                             f"--serve, or leave {'it' if len(given) == 1 else 'them'} out (see 'rxcuda demo --help')")
    if getattr(args, "serve", False) and getattr(args, "profile", None) is not None and not getattr(
            args, "in_process", None) and not args.plan:
        raise ValueError("--profile needs --in-process: 'demo --serve' runs the pipeline in an IsolatedEngine, "
                         "whose GPU process profiles nothing (docs/faults.md); add --in-process, or leave "
                         "--profile out")
    for k, default in SERVE_DEFAULTS.items():
        if getattr(args, k, None) is None:
            setattr(args, k, default)
    kernels = find_kernels(args.kernels)
    dot = getattr(args, "dot", None)
    if dot is not None:
        _check_dot(dot)
    if engine_factory is None:
        from .cuda._driver import probe

        ok, why = probe()
        if getattr(args, "serve", False):
            from ._cli_serve import serve_demo

            return serve_demo(kernels, args, null=args.plan, why="" if ok else why, out=out)
        if args.plan:
            blocks, desc, gp = plan_demo(kernels, args.size)
            print(f"The quickstart pipeline, {args.size} float32 elements per buffer, as the planner builds it:",
                  file=out)
            print(format_plan(blocks, gp, desc.fed), file=out)
            if dot is not None:
                _write_dot(desc, dot, out, gp)
            return 0
        from .engine._engine import Engine

        engine_factory = Engine
        if not ok:  # the same pipeline, computed for real on the CPU device (docs/cpu.md)
            print(f"No CUDA device ({why}): running on the CPU device", file=out)
            engine_factory = functools.partial(Engine, device="cpu")
    return run_demo(kernels, args.frames, args.size, engine_factory, out, dot=dot)


def _check_dot(path: Path) -> None:
    """Refuse ``--dot FILE`` before any work, in the command line's words: a format it does not write, a missing
    folder, Graphviz missing for .svg/.png/.pdf. ``-``: DOT text on standard output."""
    from .view._dot import FORMATS, render

    fmt = path.suffix.lstrip(".").lower()
    if str(path) != "-" and fmt not in FORMATS:
        raise ValueError(f"--dot {path}: {f'rxcuda does not write {fmt!r}' if fmt else 'no suffix'}; name the file "
                         ".dot (DOT text), .svg, .png or .pdf (Graphviz), or give - for DOT text on standard output")
    if fmt not in ("dot", "gv", ""):
        render("digraph {}", fmt)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"--dot {path}: the folder {path.parent} does not exist")


def _write_dot(what, path: Path, out: TextIO, plan=None) -> None:
    """Write the picture of ``what`` (an engine, or the demo's description with its ``plan``) for ``--dot``."""
    from .view._dot import format_of, save_graph, to_dot

    if str(path) == "-":
        return print(to_dot(what, plan=plan), end="", flush=True)
    hint = f" (render it: dot -Tsvg {path} -o pipeline.svg)" if format_of(path, None) in ("dot", "gv") else ""
    print(f"wrote a picture of the pipeline to {save_graph(what, path, plan=plan)}{hint}", file=out)


def run_demo(kernels: Path, frames: int, size: int, engine_factory: Callable, out: TextIO,
             dot: Path | None = None) -> int:
    """Run the pipeline for ``frames`` frames, hot-updating 'scale' every SEGMENT frames, and check the last
    frame of each segment against NumPy. Returns 0 when every check passed, 1 otherwise. ``dot``: write a
    picture of the pipeline there at the end (``--dot FILE``), with each block's state."""
    a, b = demo_inputs(size)
    ticks, hot_ticks, hot_tiers, worst, failures = [], [], set(), 0.0, []
    with engine_factory() as engine:
        add, mul, above = build_demo(engine, kernels, size, a, b)
        print(f"rxcuda demo on {engine.device.name}: vector_add -> scalar_mul -> append_above(> {THRESHOLD}), "
              f"{size} elements, {counted(frames, 'frame')}, scale changes every {SEGMENT} frames", file=out)
        for i in range(frames):
            if i and i % SEGMENT == 0:
                mul.params["scale"].value = SCALES[(i // SEGMENT) % len(SCALES)]
            frame = engine.tick()
            if i == 0:
                if engine.plan is None or not frame.launched:
                    log = list(getattr(engine, "diagnostic_log", ()))
                    why = log[-1].message if log else "nothing was built"
                    print(f"the pipeline did not build: {why}", file=out)
                    if dot is not None:
                        _write_dot(engine, dot, out)
                    return 1
            elif i % SEGMENT == 0:
                hot_ticks.append(frame.host_us)
                hot_tiers.add(frame.tiers)
            else:
                ticks.append(frame.host_us)
            if (i + 1) % SEGMENT == 0 or i == frames - 1:
                scale = mul.params["scale"].value
                got, count = engine.read(mul["out"]), engine.count(above["out"])
                err, problem = check_frame(a, b, scale, got, count, engine.read(above["out"]))
                worst = max(worst, err)
                print(f"  frames {i // SEGMENT * SEGMENT:>4}-{i:<4} scale {scale:>6}: out[:3] = "
                      f"{np.array2string(got[:3], precision=4)}, {count} of {size} values "
                      f"above {THRESHOLD}; {problem or 'matches NumPy'}", file=out)
                if problem:
                    failures.append(problem)
        rebuilds = getattr(engine, "rebuilds", None)
        if dot is not None:
            _write_dot(engine, dot, out)
    print(f"per frame (tick with sync): median {_median(ticks)}; with a hot update of 'scale': median "
          f"{_median(hot_ticks)}", file=out)
    if hot_ticks:
        applied = " / ".join(sorted("+".join(t) or "none" for t in hot_tiers))
        print(f"{counted(len(hot_ticks), 'hot update')} applied through: {applied}"
              + (f"; graph builds in all: {rebuilds}" if rebuilds is not None else ""), file=out)
    # check_frame stops at the first problem: the counts were checked in every segment only if none failed
    counts = "exact" if not failures else "WRONG" if any("count" in f for f in failures) else "not all checked"
    print(f"check against NumPy: max relative error {worst:.2e} (limit {MAX_REL_ERROR:.0e}), append counts "
          f"{counts}", file=out)
    if failures:
        print(f"FAILED: {counted(len(failures), 'check')} disagree{'s' if len(failures) == 1 else ''} with NumPy",
              file=out)
        return 1
    print("OK", file=out)
    return 0


def demo_inputs(size: int) -> tuple[np.ndarray, np.ndarray]:
    """The demo's inputs a and b (seeded: a client of ``demo --serve`` can check the outputs with NumPy)."""
    rng = np.random.default_rng(7)
    return rng.standard_normal(size).astype(np.float32), rng.standard_normal(size).astype(np.float32)


def check_frame(a: np.ndarray, b: np.ndarray, scale: float, got: np.ndarray, count: int,
                appended: np.ndarray) -> tuple[float, str]:
    """Judge one frame of the demo against NumPy: ``got`` is scalar_mul.out, ``count`` and ``appended``
    append_above's counter and values. Returns (max relative error of scalar_mul.out, the problem or '')."""
    expect = (a + b) * np.float32(scale)
    # relative to |expected|, floored so that values near zero are judged by their absolute error
    denom = np.maximum(np.abs(expect.astype(np.float64)), 1e-3)
    err = float(np.max(np.abs(got.astype(np.float64) - expect) / denom)) if got.shape == expect.shape else np.inf
    if not err <= MAX_REL_ERROR:  # NaN fails too
        return err, f"scalar_mul.out differs from NumPy (max relative error {err:.2e})"
    want = np.sort(expect[expect > np.float32(THRESHOLD)])
    if count != want.size:
        return err, f"append count {count}, NumPy counts {want.size}"
    if not np.array_equal(np.sort(appended), want):
        return err, "appended values differ from NumPy's selection"
    return err, ""


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} us" if values else "n/a"

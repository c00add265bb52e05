"""Rebuilding a kernels folder from its sources, with sidecars (``rxcuda kernels build [DIR]`` on the command
line, which prints what :func:`build_folder` reports and returns).

For each ``*.cu`` in the folder (sorted by name):

* ``<stem>.ptx``: ``nvcc -ptx -arch=compute_75`` where nvcc is on PATH (CUDA 13 dropped Volta; compute_75
  PTX JITs on Turing and every newer GPU), NVRTC with the same target otherwise (NVRTC's PTX carries its
  own ISA version, which a driver older than that NVRTC cannot JIT - prefer nvcc, or cubins);
* ``<stem>.cubin`` for ``cubin_arch`` (``--cubin sm_90``), when asked;
* ``<stem>.json``, the sidecar: entry, parameter names, types and directions read from the
  ``extern "C" __global__`` declaration (``_cdecl.parse_declarations``: ``const T*`` is ``in``, ``T*``
  ``out``, ``RX_INOUT``/``/*inout*/`` and friends say otherwise; ``RX_DEFAULT(v)``/``/*= v*/`` and
  ``RX_SIZE``/``/*size*/`` give scalar defaults). What the source does not say explicitly is kept from
  an existing sidecar (a default written by hand, an ``append`` pair, ``block_size``), so rebuilding an
  unchanged folder reproduces its sidecars byte for byte. Sidecars are written in one canonical layout
  (fixed key order, two-space indent, one parameter per line, trailing newline) and validated with the
  sidecar parser before they are written. A source with several kernels gets no sidecar (one entry per
  sidecar); split it to get one.

Where triton is importable, ``<stem>.triton.py`` files build to PTX + sidecar too (see
:func:`build_triton`); without triton they are skipped with a note.

Outputs are only rewritten when their bytes change, so file watchers see real changes only. A source
that fails (a compile error, a file that is not UTF-8) does not stop the others: every source is tried,
and each failure is reported (:class:`BuildReport`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from ..model._errors import CompileError, KernelFileError
from ._cdecl import ANNOTATION_FLAGS, KernelDeclaration, parse_declarations
from ._diagnostics import compile_error
from ._nvrtc import clear_cache as _clear_nvrtc_cache
from ._nvrtc import compile_module
from ._paths import read_text

log = logging.getLogger("rxcuda")
Report = Callable[[str], None]

PTX_ARCH = "compute_75"
_TOP_ORDER = ("entry", "block_size", "shared_mem", "params", "append")
_PARAM_ORDER = ("name", "type", "direction", "default", "counts")


def _say(report: Report | None, message: str) -> None:
    if report is not None:
        report(message)


def find_nvcc() -> str | None:
    """Path of nvcc (PATH, then ``$CUDA_HOME/bin``), or ``None``."""
    found = shutil.which("nvcc")
    if found:
        return found
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


def _write_if_changed(path: Path, data: bytes) -> bool:
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def _nvcc(nvcc: str, src: Path, out: Path, mode: str, arch: str) -> bytes:
    cmd = [nvcc, f"-{mode}", f"-arch={arch}", *ANNOTATION_FLAGS, src.name, "-o", out.name + ".nvcc"]
    proc = subprocess.run(cmd, cwd=src.parent, capture_output=True, text=True)
    produced = out.with_name(out.name + ".nvcc")
    if proc.returncode != 0:
        produced.unlink(missing_ok=True)
        raise compile_error(str(src), proc.stderr or proc.stdout, "nvcc") from None
    data = produced.read_bytes()
    produced.unlink()
    return data


def compile_file(src: Path, target: str, arch: str, nvcc: str | None) -> bytes:
    """PTX or a cubin of one .cu file, with nvcc when given, NVRTC otherwise."""
    if nvcc is not None:
        return _nvcc(nvcc, src, src.with_suffix("." + target), target, arch)
    module = compile_module(src, arch=arch, target=target, name=src.name)
    return module.image


# ---------------------------------------------------------------------------------------------------
# sidecars
# ---------------------------------------------------------------------------------------------------
def format_sidecar(data: dict[str, Any]) -> str:
    """The canonical text of a sidecar: keys in a fixed order (entry, block_size, shared_mem, params,
    append, then any other key sorted), two-space indent, each parameter on one line, a final newline."""
    keys = [k for k in _TOP_ORDER if k in data] + sorted(k for k in data if k not in _TOP_ORDER)
    lines = []
    for k in keys:
        v = data[k]
        if k == "params":
            if not v:
                lines.append('  "params": []')
                continue
            rows = []
            for p in v:
                pkeys = [x for x in _PARAM_ORDER if x in p] + sorted(x for x in p if x not in _PARAM_ORDER)
                rows.append("    {" + ", ".join(f"{json.dumps(x)}: {json.dumps(p[x])}" for x in pkeys) + "}")
            lines.append('  "params": [\n' + ",\n".join(rows) + "\n  ]")
        elif isinstance(v, dict):
            inner = ", ".join(f"{json.dumps(x)}: {json.dumps(y)}" for x, y in v.items())
            lines.append(f"  {json.dumps(k)}: {{{inner}}}")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def sidecar_for(decl: KernelDeclaration, existing: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sidecar of a declared kernel. Explicit annotations in the source win; otherwise what
    ``existing`` (the sidecar already there) says is kept; otherwise what the declaration implies."""
    existing = dict(existing or {})
    if existing.get("entry") not in (None, decl.entry):
        existing = {}  # a sidecar for another kernel: start over
    old_params = {p.get("name"): p for p in existing.get("params") or () if isinstance(p, dict)}
    params = []
    for p in decl.params:
        old = old_params.get(p.name, {})
        if p.pointer or p.dtype is not None:
            spelled = p.spelled()
        elif "type" in old:
            spelled = old["type"]
        else:
            raise KernelFileError(f"{decl.file}: parameter '{p.name}' of '{decl.entry}' has type '{p.ctype}', "
                                  f"which a sidecar cannot describe; use a plain scalar or pointer type")
        entry: dict[str, Any] = {"name": p.name, "type": spelled}
        if p.pointer:
            entry["direction"] = p.direction if p.direction_explicit or "direction" not in old else old["direction"]
        elif "direction" in old:
            entry["direction"] = old["direction"]
        if not p.pointer:
            if p.default_explicit:
                entry["default"] = p.default
            elif old:
                if "default" in old:
                    entry["default"] = old["default"]
            elif p.default is not None:
                entry["default"] = p.default
            if p.counts:  # RX_COUNTS(...) / /*counts ...*/ in the source
                entry["counts"] = list(p.counts)
            elif "counts" in old:
                entry["counts"] = old["counts"]
        params.append(entry)
    out: dict[str, Any] = {k: v for k, v in existing.items() if k not in ("entry", "params", "append")}
    if not existing:
        out.update(block_size=256, shared_mem=0)
    if decl.block_size is not None:
        out["block_size"] = decl.block_size
    out["entry"] = decl.entry
    out["params"] = params
    counters = [p["name"] for p in params if p.get("direction") == "counter"]
    old_append = existing.get("append")
    names = {p["name"] for p in params}
    if isinstance(old_append, dict) and old_append.get("data") in names and old_append.get("counter") in names:
        out["append"] = old_append
    elif len(counters) == 1:
        data = [p["name"] for p in params if p.get("direction") in ("out", "inout") and p["type"] != "u32*"]
        data = data or [p["name"] for p in params if p.get("direction") in ("out", "inout")]
        if len(data) == 1:
            out["append"] = {"data": data[0], "counter": counters[0]}
    return out


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("ignoring unreadable sidecar %s: %s", path, e)
        return None
    return data if isinstance(data, dict) else None


def write_sidecar(path: Path, data: dict[str, Any]) -> bool:
    """Validate and write (when changed) a sidecar; returns whether the file changed."""
    from ._sidecar import parse_sidecar

    text = format_sidecar(data)
    parse_sidecar(text, str(path))  # never write a sidecar the loader would reject
    return _write_if_changed(path, text.encode())


# ---------------------------------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------------------------------
def build_cu(src: Path, *, cubin_arch: str | None = None, nvcc: str | None = None,
             report: Report | None = None) -> list[Path]:
    """Build one .cu file: its PTX, optionally a cubin, and (single kernel) its sidecar. ``report`` gets a
    line per output (and the notes, which also go to the ``rxcuda`` logger)."""
    text = read_text(src, (".cu", ".cuh"), "CUDA source file", lambda m: KernelFileError(m, path=str(src)))
    decls = parse_declarations(text, src.name)
    outputs = []
    ptx = src.with_suffix(".ptx")
    changed = _write_if_changed(ptx, compile_file(src, "ptx", PTX_ARCH, nvcc))
    outputs.append(ptx)
    _say(report, f"{'built' if changed else 'unchanged'} {ptx}")
    if cubin_arch:
        cubin = src.with_suffix(".cubin")
        changed = _write_if_changed(cubin, compile_file(src, "cubin", cubin_arch, nvcc))
        outputs.append(cubin)
        _say(report, f"{'built' if changed else 'unchanged'} {cubin}")
    note = None
    if len(decls) == 1:
        (decl,) = decls.values()
        side = src.with_suffix(".json")
        changed = write_sidecar(side, sidecar_for(decl, _read_json(side)))
        outputs.append(side)
        _say(report, f"{'wrote' if changed else 'unchanged'} {side}")
    elif not decls:
        note = f"{src}: no extern \"C\" __global__ kernel, so no sidecar"
    else:
        note = (f"{src}: {len(decls)} kernels ({', '.join(decls)}); a sidecar describes one entry, so none was "
                f"written - put each kernel in its own file to get one")
    if note is not None:
        log.warning("%s", note)
        _say(report, f"note: {note}")
    return outputs


_TRITON_TYPES = {
    "fp16": "f16", "fp32": "f32", "fp64": "f64", "i8": "i8", "i16": "i16", "i32": "i32", "i64": "i64",
    "u8": "u8", "u16": "u16", "u32": "u32", "u64": "u64",
}


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def build_triton(src: Path, *, report: Report | None = None) -> list[Path]:
    """Build a ``<stem>.triton.py`` file to ``<stem>.ptx`` + ``<stem>.json``.

    The file defines a ``@triton.jit`` kernel and says how to compile it in ``RXCUDA_KERNEL``::

        RXCUDA_KERNEL = {
            "kernel": scale,                                   # the @triton.jit function
            "signature": {"x": "*fp32", "out": "*fp32", "s": "fp32", "n": "i32"},
            "constexprs": {"BLOCK": 1024},
            "directions": {"out": "out"},                      # pointers default to "in"
            "defaults": {"s": 1.0, "n": "size"},
            "num_warps": 4,                                    # block_size = 32 * num_warps
            "arch": 75,                                        # PTX target (compute capability)
        }

    Parameters Triton adds to the PTX entry (scratch pointers) are named ``triton_scratch<k>``
    (``void*``, in); bind them to a small buffer (or a null pointer where the kernel does not use them).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ._ptx import parse_ptx

    spec_mod = importlib.util.spec_from_file_location(f"rxcuda_triton_{src.stem.replace('.', '_')}", src)
    module = importlib.util.module_from_spec(spec_mod)
    spec_mod.loader.exec_module(module)
    spec = getattr(module, "RXCUDA_KERNEL", None)
    if not isinstance(spec, dict) or "kernel" not in spec or "signature" not in spec:
        raise KernelFileError(f"{src}: define RXCUDA_KERNEL = {{'kernel': fn, 'signature': {{...}}, ...}}",
                              path=str(src))
    sig = dict(spec["signature"])
    constexprs = dict(spec.get("constexprs", {}))
    full_sig = {**sig, **{k: "constexpr" for k in constexprs}}
    num_warps = int(spec.get("num_warps", 4))
    arch = int(spec.get("arch", 75))
    compiled = triton.compile(ASTSource(fn=spec["kernel"], signature=full_sig, constexprs=constexprs),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    ptx_text = compiled.asm["ptx"]
    entry = compiled.metadata.name
    stem = src.name[: -len(".triton.py")]
    ptx = src.with_name(stem + ".ptx")
    outputs = [ptx]
    _say(report, f"{'built' if _write_if_changed(ptx, ptx_text.encode()) else 'unchanged'} {ptx}")
    real = parse_ptx(ptx_text)[entry]
    directions = spec.get("directions", {})
    defaults = spec.get("defaults", {})
    params = []
    for name, t in sig.items():
        pointer = t.startswith("*")
        base = _TRITON_TYPES.get(t.lstrip("*"))
        if base is None:
            raise KernelFileError(f"{src}: Triton type {t!r} of '{name}' has no sidecar spelling", path=str(src))
        p: dict[str, Any] = {"name": name, "type": base + ("*" if pointer else "")}
        if pointer:
            p["direction"] = directions.get(name, "in")
        elif name in defaults:
            p["default"] = defaults[name]
        params.append(p)
    for k in range(len(real) - len(params)):
        params.append({"name": f"triton_scratch{k}", "type": "void*", "direction": "in"})
    side = src.with_name(stem + ".json")
    data = {"entry": entry, "block_size": 32 * num_warps, "shared_mem": int(compiled.metadata.shared),
            "params": params}
    _say(report, f"{'wrote' if write_sidecar(side, data) else 'unchanged'} {side}")
    outputs.append(side)
    return outputs


@attrs.frozen
class BuildFailure:
    """A source that did not build, and why."""

    source: Path
    error: Exception

    def summary(self) -> str:
        """One line: the first compiler error (and how many more), or the error's first line."""
        diags = [d for d in getattr(self.error, "diagnostics", ()) if d.severity == "error"]
        if diags:
            more = f" (and {len(diags) - 1} more error(s))" if len(diags) > 1 else ""
            first = diags[0]
            where = Path(first.file) if Path(first.file).is_absolute() else self.source.parent / first.file
            col = f":{first.column}" if first.column else ""
            return f"{where}:{first.line}{col}: error: {first.message}{more}"
        text = str(self.error).strip().splitlines()[0] if str(self.error).strip() else type(self.error).__name__
        return text if str(self.source) in text else f"{self.source}: {text}"


@attrs.frozen
class BuildReport:
    """What :func:`build_folder` did: the outputs up to date, and each source that failed."""

    outputs: tuple[Path, ...]
    failures: tuple[BuildFailure, ...]

    @property
    def ok(self) -> bool:
        return not self.failures


def build_folder(directory: str | os.PathLike = "kernels", cubin_arch: str | None = None, *,
                 use_nvcc: bool | None = None, triton: bool = True, report: Report | None = None) -> BuildReport:
    """Build every ``*.cu`` (and, with triton, ``*.triton.py``) in ``directory``. A source that fails is
    recorded and the others are still built. ``use_nvcc``: ``None`` uses nvcc when it is found, ``False``
    forces NVRTC, ``True`` requires nvcc. Raises only for the folder itself (missing; nvcc asked for but
    absent)."""
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such kernels directory")
    nvcc = None if use_nvcc is False else find_nvcc()
    if use_nvcc and nvcc is None:
        raise CompileError("nvcc was asked for but is not on PATH (nor in $CUDA_HOME/bin); drop --nvcc or "
                           "install the CUDA toolkit")
    _say(report, f"compiling with {'nvcc (' + nvcc + ')' if nvcc else 'NVRTC'}; PTX for {PTX_ARCH}"
         + (f", cubins for {cubin_arch}" if cubin_arch else ""))
    outputs: list[Path] = []
    failures: list[BuildFailure] = []

    def attempt(src: Path, build: Callable[[], list[Path]]) -> None:
        try:
            outputs.extend(build())
        except (CompileError, KernelFileError, ValueError, OSError) as e:
            failures.append(BuildFailure(src, e))
            log.warning("could not build %s: %s", src, e)

    for src in sorted(root.glob("*.cu")):
        attempt(src, lambda src=src: build_cu(src, cubin_arch=cubin_arch, nvcc=nvcc, report=report))
    tritons = sorted(root.glob("*.triton.py"))
    if tritons and triton:
        if triton_available():
            for src in tritons:
                attempt(src, lambda src=src: build_triton(src, report=report))
        else:
            _say(report, f"skipped {len(tritons)} Triton kernel(s): triton is not installed")
    return BuildReport(tuple(outputs), tuple(failures))


def build_kernels(directory: str | os.PathLike = "kernels", cubin_arch: str | None = None, *,
                  use_nvcc: bool | None = None, triton: bool = True, report: Report | None = None) -> list[Path]:
    """Build a kernels folder like :func:`build_folder`; returns the output paths. When sources failed,
    raises :class:`CompileError` after building the others: its message lists every failure, its
    ``diagnostics`` are theirs in order, and ``failures`` holds the :class:`BuildFailure` records."""
    result = build_folder(directory, cubin_arch, use_nvcc=use_nvcc, triton=triton, report=report)
    if result.failures:
        n = len(result.failures)
        lines = "\n".join(f"  {f.summary()}" for f in result.failures)
        error = CompileError(f"{n} kernel source(s) in {directory} did not build:\n{lines}",
                             diagnostics=tuple(d for f in result.failures
                                               for d in getattr(f.error, "diagnostics", ())))
        error.failures = result.failures
        raise error
    return list(result.outputs)


def clear_cache() -> Path | None:
    """Empty rxcuda's compile cache (memory and disk); returns its directory."""
    from ._compose import _clear_code_memo

    _clear_code_memo()
    return _clear_nvrtc_cache()

"""Compiler messages as data: ``file(line): error: message`` lines (NVRTC and nvcc write the same form)
read into :class:`Diagnostic` records, and the :class:`CompileError` that carries them."""

from __future__ import annotations

import re
from typing import NamedTuple

from ..model._errors import CompileError


class Diagnostic(NamedTuple):
    """One message from the compiler: where (1-based line and column; column 0 if unknown) and what."""

    file: str
    line: int
    column: int
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" + (f":{self.column}" if self.column else "")
        return f"{where}: {self.severity}: {self.message}"


_DIAG_RE = re.compile(
    r"^(?P<file>.*?)\((?P<line>\d+)\): (?P<sev>catastrophic error|error|warning|remark|note)"
    r"(?: #[\w-]+)?: (?P<msg>.*)$"
)


def parse_diagnostics(log: str) -> tuple[Diagnostic, ...]:
    """The structured messages of a compiler log (``file(line): error: message`` plus a caret line)."""
    lines = log.replace("\x00", "").splitlines()
    out: list[Diagnostic] = []
    for k, text in enumerate(lines):
        m = _DIAG_RE.match(text)
        if m is None:
            continue
        column = 0
        # The compiler echoes the source line indented by two spaces, then a caret under the offending column.
        if k + 2 < len(lines) and lines[k + 2].strip() == "^" and lines[k + 1].startswith("  "):
            column = lines[k + 2].index("^") - 1
        severity = "error" if m.group("sev") == "catastrophic error" else m.group("sev")
        out.append(Diagnostic(m.group("file"), int(m.group("line")), column, m.group("msg").strip(), severity))
    return tuple(out)


def compile_error(name: str, log: str, compiler: str = "NVRTC", hint: str = "") -> CompileError:
    """The :class:`CompileError` for a failed compile of ``name`` by ``compiler`` ('NVRTC' or 'nvcc'),
    listing the first errors of ``log``; ``hint`` (a sentence) is appended when given."""
    log = log.replace("\x00", "").strip()
    diags = parse_diagnostics(log)
    errors = [d for d in diags if d.severity == "error"] or list(diags)
    if errors:
        shown = "\n".join(f"  {d}" for d in errors[:5])
        more = f"\n  ... and {len(errors) - 5} more" if len(errors) > 5 else ""
        message = f"{compiler} could not compile {name}: {len(errors)} error(s)\n{shown}{more}"
    else:
        message = f"{compiler} could not compile {name}:\n{log}"
    if hint:
        message += f"\n{hint}"
    return CompileError(message, diagnostics=diags, log=log)


def declaration_error(file: str, line: int, message: str) -> CompileError:
    """A :class:`CompileError` about a kernel declaration at ``file:line``."""
    return CompileError(f"{file}:{line}: {message}", diagnostics=(Diagnostic(file, line, 0, message),))

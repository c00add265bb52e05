"""The code blocks of README.md and of the documentation site (docs/**/*.md), for the tests that run them.

Every ```python block declares on its first line whether it stands alone (``# snippet: NAME``) or continues
an earlier block of the same file (``# continues: NAME``: it runs appended to that block); after the name, ``--``
and notes separated by commas: ``runs without a GPU`` marks the blocks tests/unit/test_docs.py runs
(tests/gpu/test_docs_gpu.py runs them all), ``needs '.[EXTRA]'`` the extra the block needs beyond
``pip install .`` (tools/check_wheel.sh runs each block with exactly the extras it names; a continuation needs
those of the blocks it continues too).
Every block must work both as a script and pasted line by line into an interactive interpreter
(:func:`paste`), where a blank line ends an indented block and a statement after an indented block needs a
blank line before it.
"""

from __future__ import annotations

import code
import pathlib
import re
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
_MARKER = re.compile(r"#\s*(snippet|continues):\s*([\w.-]+)\s*(?:--\s*(.*?))?\s*$")
NO_GPU = "runs without a GPU"
_NEEDS = re.compile(r"needs '\.\[([\w,-]+)\]'")

# the kernels shipped inside the package (rxcuda.kernels), which snippets name as "vector_add", ...
SHIPPED = ("vector_add", "scalar_mul", "saxpy", "vector_sub", "vector_add3", "append_above")


def build_site(out: pathlib.Path) -> pathlib.Path:
    """``mkdocs build --strict`` (warnings are errors) of this checkout into ``out``; returns ``out``. Raises
    AssertionError with mkdocs' output when the build fails."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def doc_files() -> list[pathlib.Path]:
    """README.md, then every page of the site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


@dataclass(frozen=True)
class Fenced:
    """A fenced block: its info string (``python``, ``json``, ...), text and the line of its opening fence."""

    lang: str
    text: str
    line: int


@dataclass(frozen=True)
class Snippet:
    """A python block. ``name``: its own (``# snippet: NAME``) or, for a continuation, ``NAME+N``;
    ``source`` is what runs: the blocks it continues, in order, then its own text."""

    file: str
    name: str
    line: int
    own: str
    continues: str | None
    no_gpu: bool
    source: str
    extras: tuple[str, ...] = ()  # the extras it needs (``needs '.[notebook]'``), with those of what it continues

    @property
    def id(self) -> str:
        return f"{self.file}:{self.name}"


def fenced_blocks(text: str) -> list[Fenced]:
    return [Fenced(m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in _FENCE.finditer(text)]


class SnippetError(ValueError):
    pass


def snippets(text: str, file: str = "README.md") -> list[Snippet]:
    """The python blocks of one file, each with the source to run. Raises SnippetError for a block without a
    marker on its first line, a name used twice in the file, or a continuation of a block not above it."""
    out: list[Snippet] = []
    sources: dict[str, str] = {}
    needed: dict[str, tuple[str, ...]] = {}
    for block in fenced_blocks(text):
        if block.lang != "python":
            continue
        first = block.text.split("\n", 1)[0]
        m = _MARKER.fullmatch(first.strip())
        where = f"{file}:{block.line + 1}"
        if m is None:
            raise SnippetError(f"{where}: a python block starts with '# snippet: NAME' or '# continues: NAME' "
                               f"(got {first!r})")
        kind, name, note = m.groups()
        notes = [n.strip() for n in note.split(", ")] if note else []
        extras = tuple(e for n in notes if (x := _NEEDS.fullmatch(n)) for e in x.group(1).split(","))
        unknown = [n for n in notes if n != NO_GPU and not _NEEDS.fullmatch(n)]
        if unknown:
            raise SnippetError(f"{where}: unknown note {unknown[0]!r} (notes: '{NO_GPU}', \"needs '.[EXTRA]'\")")
        if kind == "snippet":
            if name in sources:
                raise SnippetError(f"{where}: a second snippet named {name!r} in {file}")
            source, own_name, parent = block.text, name, None
        else:
            if name not in sources:
                raise SnippetError(f"{where}: continues {name!r}, which no block above it in {file} is named "
                                   f"(named: {', '.join(sources) or 'none'})")
            source = sources[name] + "\n" + block.text
            own_name, parent = f"{name}+{sum(s.continues == name for s in out) + 1}", name
            extras = tuple(dict.fromkeys(needed[name] + extras))
        sources[name], needed[name] = source, extras  # a later continuation of NAME runs after this one too
        out.append(Snippet(file, own_name, block.line, block.text, parent, NO_GPU in notes, source, extras))
    return out


def all_snippets() -> list[Snippet]:
    return [s for path in doc_files() for s in snippets(path.read_text(), rel(path))]


# -- pasting into an interactive interpreter --------------------------------------------------------------
class PasteError(Exception):
    """A block that fails pasted into the interpreter: the line, and what the interpreter said."""


class _Console(code.InteractiveConsole):
    def __init__(self, run: bool):
        super().__init__(locals={"__name__": "__console__", "__doc__": None})
        self.run = run
        self.current = ""

    def runcode(self, code):  # noqa: D102 - compile-only when not running
        if self.run:
            super().runcode(code)

    def showsyntaxerror(self, filename=None, **kwargs):
        raise PasteError(f"pasting line {self.current!r} into the interpreter is a syntax error "
                         f"(a blank line inside an indented block, or no blank line after one?)")

    def showtraceback(self):
        import sys
        import traceback

        kind, value, tb = sys.exc_info()
        text = "".join(traceback.format_exception(kind, value, tb))
        raise PasteError(f"pasted into the interpreter, the block raised at {self.current!r}:\n{text}") from value


def paste(source: str, *, run: bool) -> None:
    """Feed ``source`` line by line to an interactive interpreter, as pasting it would. ``run=False`` only
    compiles each statement as the interpreter gets it (no GPU needed, any block); ``run=True`` runs them.
    Raises PasteError naming the line the interpreter refused or that raised."""
    console = _Console(run)
    more = False
    for line in source.split("\n"):
        console.current = line
        more = console.push(line)
    if more:
        console.current = "<a blank line at the end>"
        more = console.push("")
    if more:
        raise PasteError("the block leaves the interpreter waiting for more input")

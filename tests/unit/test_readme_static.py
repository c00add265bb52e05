"""The README says what the code does, checked without a GPU.

Every ```python block compiles and declares on its first line whether it stands alone (``# snippet: NAME``)
or continues an earlier block (``# continues: NAME``, run appended to that block); the blocks marked
``-- runs without a GPU`` run here; every ``rxcuda`` name the README uses exists, and so does every
``engine.X`` / ``block.X`` attribute it uses; kernels are named as shipped (``Block.from_kernel("vector_add")``),
never as a path into the repository, so the blocks run from any directory; the Layout section names
every folder of the package and only modules that exist; JSON blocks parse; and the README opens with the
two commands. tests/gpu/test_readme.py runs every python block on a GPU, with the parser below.
"""

from __future__ import annotations

import ast
import importlib
import json
import pathlib
import re
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
_MARKER = re.compile(r"#\s*(snippet|continues):\s*([\w.-]+)\s*(?:--\s*(.*?))?\s*$")
NO_GPU = "runs without a GPU"


@dataclass(frozen=True)
class Block:
    """A fenced block of the README: its info string (``python``, ``json``, ...), text and first line."""

    lang: str
    text: str
    line: int  # 1-based line of the opening fence


@dataclass(frozen=True)
class Snippet:
    """A python block. ``name``: its own (``# snippet: NAME``) or, for a continuation, ``NAME+N``.
    ``source`` is what runs: the blocks it continues, in order, then its own text."""

    name: str
    line: int
    own: str
    continues: str | None
    no_gpu: bool
    source: str


def fenced_blocks(text: str) -> list[Block]:
    return [Block(m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in _FENCE.finditer(text)]


class SnippetError(ValueError):
    pass


def readme_snippets(text: str | None = None) -> list[Snippet]:
    """The README's python blocks, each with the source to run. Raises SnippetError for a block without a
    marker on its first line, a name used twice, or a continuation of a block that is not above it."""
    text = README.read_text() if text is None else text
    out: list[Snippet] = []
    sources: dict[str, str] = {}
    for block in fenced_blocks(text):
        if block.lang != "python":
            continue
        first = block.text.split("\n", 1)[0]
        m = _MARKER.fullmatch(first.strip())
        where = f"README.md:{block.line + 1}"
        if m is None:
            raise SnippetError(f"{where}: a python block starts with '# snippet: NAME' or '# continues: NAME' "
                               f"(got {first!r})")
        kind, name, note = m.groups()
        if note not in (None, NO_GPU):
            raise SnippetError(f"{where}: unknown note {note!r} (the only one is '-- {NO_GPU}')")
        if kind == "snippet":
            if name in sources:
                raise SnippetError(f"{where}: a second snippet named {name!r}")
            source, own_name, parent = block.text, name, None
        else:
            if name not in sources:
                raise SnippetError(f"{where}: continues {name!r}, which no block above it is named "
                                   f"(named: {', '.join(sources) or 'none'})")
            source = sources[name] + "\n" + block.text
            own_name, parent = f"{name}+{sum(s.continues == name for s in out) + 1}", name
        sources[name] = source  # a later continuation of NAME runs after this one too
        out.append(Snippet(own_name, block.line, block.text, parent, note == NO_GPU, source))
    return out


TEXT = README.read_text()
SNIPPETS = readme_snippets(TEXT)


def test_the_readme_opens_with_the_two_commands():
    lines = TEXT.split("\n")
    assert lines[0] == "# rxcuda" and lines[1] == ""
    assert lines[2] == "```sh" and lines[5] == "```"
    assert [line.split("#")[0].strip() for line in lines[3:5]] == ["make demo", "make test"]


def test_every_python_block_is_a_named_snippet_or_a_continuation():
    assert len(SNIPPETS) >= 10
    assert any(s.continues for s in SNIPPETS)  # the continuation marker is in use, and resolved


def test_the_parser_refuses_unmarked_blocks_and_unknown_continuations():
    with pytest.raises(SnippetError, match="starts with"):
        readme_snippets("```python\nimport rxcuda\n```\n")
    with pytest.raises(SnippetError, match="no block above it is named"):
        readme_snippets("```python\n# continues: later\nx = 1\n```\n```python\n# snippet: later\n```\n")
    with pytest.raises(SnippetError, match="a second snippet"):
        readme_snippets("```python\n# snippet: a\n```\n```python\n# snippet: a\n```\n")
    chained = readme_snippets("```python\n# snippet: a\nx = 1\n```\n```python\n# continues: a\ny = x\n```\n"
                              "```python\n# continues: a\nz = y\n```\n")
    assert [s.name for s in chained] == ["a", "a+1", "a+2"]
    assert chained[2].source.split() == ["#", "snippet:", "a", "x", "=", "1", "#", "continues:", "a", "y", "=",
                                         "x", "#", "continues:", "a", "z", "=", "y"]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.name)
def test_every_python_block_compiles(snippet):
    compile(snippet.source, f"README.md snippet {snippet.name}", "exec")


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if s.no_gpu], ids=lambda s: s.name)
def test_blocks_marked_without_a_gpu_run_here(snippet, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # any directory: the kernels come from the package
    code = compile(snippet.source, f"README.md snippet {snippet.name}", "exec")
    exec(code, {"__name__": "__readme__"})  # noqa: S102 - running the documentation is the test


# -- names ---------------------------------------------------------------------------------------------
def _resolve(dotted: str):
    """The object a dotted name such as ``rxcuda.cuda.NullDriver`` or ``rxcuda.Block.from_kernel`` names."""
    parts = dotted.split(".")
    if parts[:2] == ["rxcuda", "examples"] and len(parts) == 3:  # an example runs when imported: look it up
        from rxcuda import examples

        return examples if parts[2].isupper() else examples.describe(parts[2])  # NAME: a placeholder
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[: i + 1]))  # a submodule not imported yet
    return obj


def _aliases() -> dict[str, str]:
    """Names the README's python blocks bind to rxcuda modules and objects (``rx`` -> ``rxcuda.lang``)."""
    out = {"rxcuda": "rxcuda"}
    for s in SNIPPETS:
        for node in ast.walk(ast.parse(s.own)):
            if isinstance(node, ast.Import):
                out.update({a.asname or a.name: a.name for a in node.names if a.name.startswith("rxcuda")})
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rxcuda"):
                out.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return out


ALIASES = _aliases()


def test_every_rxcuda_import_in_the_python_blocks_exists():
    missing = []
    for alias, dotted in ALIASES.items():
        try:
            _resolve(dotted)
        except (ImportError, AttributeError) as e:
            missing.append(f"{alias} = {dotted}: {e}")
    assert not missing


def _dotted_uses(text: str, head: str) -> set[str]:
    """``head.a.b`` chains in the text (prose and code), as ``a.b``."""
    return set(re.findall(rf"(?<![\w.]){re.escape(head)}((?:\.[A-Za-z_]\w*)+)", text))


# checked on instances (an engine on the null driver, a block), where attributes set in __init__ exist
INSTANCES = ("engine", "block", "Frame", "Diagnostic", "Tier", "Block", "BlockBuilder", "NullDriver")


@pytest.mark.parametrize("alias", sorted(set(ALIASES) - set(INSTANCES)))
def test_every_name_used_through_rxcuda_or_an_alias_exists(alias):
    """``rxcuda.X.Y`` anywhere in the README, and ``rx.sin`` where a block bound ``rx`` to rxcuda.lang."""
    missing = []
    for chain in sorted(_dotted_uses(TEXT, alias)):
        dotted = ALIASES[alias] + chain
        try:
            _resolve(dotted)
        except (ImportError, AttributeError):
            missing.append(f"{alias}{chain}")
    assert not missing, f"the README uses names that do not exist: {missing}"


def test_every_engine_and_block_attribute_the_readme_uses_exists():
    import numpy as np

    import rxcuda
    from rxcuda.cuda import NullDriver

    api = NullDriver()
    with rxcuda.Engine(driver=api) as engine:
        block = engine.add(rxcuda.Block.from_kernel(ROOT / "kernels/vector_add.ptx", size=16))
        engine.write(block["a"], np.zeros(16, np.float32))
        engine.write(block["b"], np.zeros(16, np.float32))
        engine.tick()
        things = {"engine": engine, "block": block, "Frame": rxcuda.Frame, "Diagnostic": rxcuda.Diagnostic,
                  "Tier": rxcuda.Tier, "Block": rxcuda.Block, "BlockBuilder": rxcuda.BlockBuilder,
                  "NullDriver": api}
        assert set(things) == set(INSTANCES)
        missing = [f"{head}{chain}" for head, obj in things.items() for chain in _dotted_uses(TEXT, head)
                   if not hasattr(obj, chain.split(".")[1])]
    assert not missing, f"the README uses attributes that do not exist: {sorted(missing)}"


def test_the_readme_names_shipped_kernels_never_a_repository_path():
    from rxcuda import kernels

    names = set(re.findall(r'(?:from_kernel|from_cuda|kernels\.path)\("([\w.]+)"', TEXT))
    assert {"vector_add", "scalar_mul"} <= names, "the README loads no shipped kernel by name?"
    assert sorted(n for n in names if n.split(".")[0] not in kernels.names()) == []
    assert re.findall(r"(?<![\w/.-])kernels/[\w./-]+", TEXT) == []  # would run only from the repository root


def test_json_blocks_parse():
    blocks = [b for b in fenced_blocks(TEXT) if b.lang == "json"]
    assert blocks
    for b in blocks:
        json.loads(b.text)


# -- the Layout section --------------------------------------------------------------------------------
def _layout() -> str:
    section = TEXT.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return next(b.text for b in fenced_blocks(section))


def test_the_layout_names_every_folder_of_the_package():
    folders = sorted(str(p.parent.relative_to(ROOT / "rxcuda")) for p in (ROOT / "rxcuda").rglob("__init__.py")
                     if p.parent != ROOT / "rxcuda")
    named = set(re.findall(r"^\s+(\w+)/", _layout(), re.M))
    assert [f for f in folders if f.split("/")[-1] not in named] == []


def test_the_layout_names_only_modules_that_exist():
    """Each folder's lines name its modules as ``_name``; each must be a file in that folder."""
    missing, folder = [], None
    for line in _layout().split("\n"):
        m = re.match(r"^(\s*)([\w.]+)/\s", line)
        if m and line.startswith("  "):
            depth = len(m.group(1)) // 2
            folder = ROOT / "rxcuda" / m.group(2) if depth == 1 else folder / m.group(2)
        elif m:
            folder = None  # a top-level folder (kernels/, tests/...) or rxcuda/ itself
        if folder is None:
            continue
        for name in re.findall(r"(?<![\w.])(_[a-z]\w*)\b", line):
            if not (folder / f"{name}.py").is_file():
                missing.append(f"{folder.relative_to(ROOT)}/{name}.py")
    assert missing == []

"""The README and the documentation site say what the code does, checked without a GPU.

Every ```python block of README.md and docs/**/*.md compiles and declares on its first line whether it stands
alone (``# snippet: NAME``) or continues an earlier block of its file (``# continues: NAME``); every block
pastes into an interactive interpreter as it stands (compiled statement by statement); the blocks marked
``-- runs without a GPU`` run here from another directory, as a script and pasted into an interpreter; every
``rxcuda`` name the pages use exists, and so does every ``engine.X`` / ``block.X`` attribute; the kernels they
name are the shipped ones; JSON blocks parse; the architecture page's layout names every folder of the
package; and the README opens with the two commands and stays a landing page. tests/gpu/test_docs_gpu.py runs
every python block on a GPU, with the parser in tests/unit/_docs.py.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re

import pytest
from _docs import (
    DOCS,
    ROOT,
    SHIPPED,
    PasteError,
    SnippetError,
    all_snippets,
    build_site,
    doc_files,
    fenced_blocks,
    paste,
    rel,
    snippets,
)

SNIPPETS = all_snippets()
FILES = {rel(p): p.read_text() for p in doc_files()}



# -- the README: a landing page --------------------------------------------------------------------------
def test_the_readme_opens_with_the_two_commands():
    lines = FILES["README.md"].split("\n")
    assert lines[0] == "# rxcuda" and lines[1] == ""
    assert lines[2] == "```sh" and lines[5] == "```"
    assert [line.split("#")[0].strip() for line in lines[3:5]] == ["make demo", "make test"]


def test_the_readme_is_a_landing_page_that_links_into_the_site():
    text = FILES["README.md"]
    assert text.count("\n") <= 260
    linked = set(re.findall(r"\]\((docs/[\w/-]+\.md)(?:#[\w-]+)?\)", text))
    assert {"docs/getting-started.md", "docs/concepts.md", "docs/architecture.md", "docs/api.md"} <= linked
    assert [p for p in linked if not (ROOT / p).is_file()] == []
    assert "docs/live-view.png" in text and (DOCS / "live-view.png").is_file()


def test_every_page_is_in_the_site_navigation():
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml uses !!python/name tags for Material's emoji extension: read them as plain strings
    _Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: suffix)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)

    def pages(nav):
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from pages(value) if isinstance(value, list) else [value]

    listed = set(pages(config["nav"]))
    assert sorted(rel(p)[len("docs/"):] for p in DOCS.rglob("*.md") if rel(p)[len("docs/"):] not in listed) == []
    assert config["theme"]["font"] is False  # no web fonts: the site needs no internet


GLOSSARY = ("Frame", "Tick", "Tier", "Hot update", "Warm update", "Exec-node update", "Recapture", "Structure change",
            "Null driver", "Block", "Port", "Parameter", "Region", "Delayed connection", "Append output",
            "Composite", "Fragment", "Engine", "Diagnostic", "Last good graph")


def test_the_glossary_defines_the_words_the_pages_use():
    text = FILES["docs/concepts.md"].split("\n## Glossary\n", 1)[1]
    defined = set(re.findall(r"^(\S[^\n]*)\n:   ", text, re.M))  # a definition list: term, then ":   ..."
    assert [term for term in GLOSSARY if term not in defined] == []


# -- the blocks ------------------------------------------------------------------------------------------
def test_every_python_block_is_a_named_snippet_or_a_continuation():
    assert len(SNIPPETS) >= 25
    assert any(s.continues for s in SNIPPETS)  # the continuation marker is in use, and resolved
    assert {s.file for s in SNIPPETS} >= {"docs/getting-started.md", "docs/regions.md", "README.md"}


def test_the_parser_refuses_unmarked_blocks_and_unknown_continuations():
    with pytest.raises(SnippetError, match="starts with"):
        snippets("```python\nimport rxcuda\n```\n")
    with pytest.raises(SnippetError, match="no block above it in page.md is named"):
        snippets("```python\n# continues: later\nx = 1\n```\n```python\n# snippet: later\n```\n", "page.md")
    with pytest.raises(SnippetError, match="a second snippet"):
        snippets("```python\n# snippet: a\n```\n```python\n# snippet: a\n```\n")
    with pytest.raises(SnippetError, match="unknown note"):
        snippets("```python\n# snippet: a -- runs fast\n```\n")
    chained = snippets("```python\n# snippet: a\nx = 1\n```\n```python\n# continues: a\ny = x\n```\n"
                       "```python\n# continues: a\nz = y\n```\n")
    assert [s.name for s in chained] == ["a", "a+1", "a+2"]
    assert chained[2].source.split() == ["#", "snippet:", "a", "x", "=", "1", "#", "continues:", "a", "y", "=",
                                         "x", "#", "continues:", "a", "z", "=", "y"]


def test_a_block_names_the_extras_it_needs():
    (a, b) = snippets("```python\n# snippet: a -- runs without a GPU, needs '.[notebook]'\n```\n"
                      "```python\n# continues: a -- needs '.[view,media]'\n```\n")
    assert a.no_gpu and a.extras == ("notebook",) and not b.no_gpu and b.extras == ("notebook", "view", "media")
    with pytest.raises(SnippetError, match="unknown note"):
        snippets("```python\n# snippet: a -- needs rxcuda[view]\n```\n")


# what a block uses that only an extra brings (lines that are comments aside)
EXTRA_USES = {"ray": r"rxcuda\.distributed|^import ray", "notebook": r"widgets\(|ipywidgets",
              "view": r"\.serve\(|plot_frames|save_graph\([^)]*\.(?:svg|png|pdf)",
              "media": r"\bmedia\.(?:video|audio|camera)|^import av\b|soundfile",
              "gl": r"moderngl|gl_buffer|gl_texture"}


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.id)
def test_every_block_names_exactly_the_extras_it_uses(snippet):
    """README's and the pages' install lines agree with their blocks: a block that uses what an extra brings says
    ``needs '.[EXTRA]'`` (tools/check_wheel.sh runs it with exactly those), and names no extra it does not use."""
    import tomllib

    code = "\n".join(line.strip() for line in snippet.source.split("\n") if not line.strip().startswith("#"))
    uses = sorted(extra for extra, pattern in EXTRA_USES.items() if re.search(pattern, code, re.M))
    assert sorted(snippet.extras) == uses
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(snippet.extras) <= set(extras)


def _extras() -> dict[str, list[str]]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


INSTALLED_FROM_PYPI = re.compile(r"pip install (?:-U |--upgrade )?['\"]?rxcuda\b|rxcuda\[\w")  # not on PyPI


def _sources_that_say_how_to_install() -> dict[str, str]:
    """The pages, and what rxcuda, its examples and its tools print (their install hints)."""
    out = dict(FILES)
    for folder in ("rxcuda", "examples", "bench", "tools"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".ipynb", ".sh"):
                out[rel(path)] = path.read_text()
    return out


def test_every_install_line_works_from_a_checkout():
    """rxcuda is installed from a checkout (pip install '.[EXTRA]') or its wheel: no page, message or example
    says pip install 'rxcuda[...]' or pip install rxcuda, which resolve to nothing."""
    said = {f: sorted(set(m.group(0) for m in INSTALLED_FROM_PYPI.finditer(t))) for f, t in
            _sources_that_say_how_to_install().items()}
    assert {f: s for f, s in said.items() if s} == {}
    extras = _extras()
    named = {e for t in _sources_that_say_how_to_install().values()
             for group in re.findall(r"pip install '\.\[([\w,]+)\]'", t) for e in group.split(",")}
    assert named and named - {"EXTRA", "EXTRAS", "extras"} <= set(extras)  # (placeholders where the text says how)


def test_the_install_page_covers_every_extra_and_the_wheel():
    section = FILES["docs/getting-started.md"].split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    assert rows == set(_extras())
    assert "pip wheel --no-deps -w dist ." in section and ".whl[notebook]'" in section


def test_the_readme_install_lines_bring_what_its_blocks_need():
    lines = next(b.text for b in fenced_blocks(FILES["README.md"]) if b.lang == "sh" and "pip install ." in b.text)
    installed = {e for group in re.findall(r"pip install '\.\[([\w,]+)\]'", lines) for e in group.split(",")}
    needed = {e for s in SNIPPETS if s.file == "README.md" for e in s.extras}
    assert needed and needed <= installed


def test_snippet_names_are_scoped_per_file():
    assert [s.id for s in snippets("```python\n# snippet: a\n```\n", "one.md")] == ["one.md:a"]
    names = [s.id for s in SNIPPETS]
    assert len(names) == len(set(names))


def test_paste_refuses_what_an_interactive_interpreter_refuses():
    with pytest.raises(PasteError, match="syntax error"):  # a statement right after an indented block
        paste("for i in range(2):\n    x = i\nprint(x)\n", run=False)
    with pytest.raises(PasteError, match="syntax error"):  # a blank line inside an indented block
        paste("with open(__file__) as f:\n    a = 1\n\n    b = 2\n", run=False)
    with pytest.raises(PasteError, match="raised at 'y = 1 / 0'"):
        paste("x = 1\ny = 1 / 0\n", run=True)
    paste("for i in range(2):\n    x = i\n\nassert x == 1\n", run=True)
    paste('s = """a\n\nb"""\nassert s.count("\\n") == 2\n', run=True)  # a blank line inside a string is fine


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.id)
def test_every_python_block_compiles(snippet):
    compile(snippet.source, f"{snippet.id}", "exec")


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.id)
def test_every_python_block_pastes_into_an_interactive_interpreter(snippet):
    paste(snippet.source, run=False)


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if s.no_gpu], ids=lambda s: s.id)
def test_blocks_marked_without_a_gpu_run_from_any_directory(snippet, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RXCUDA_VIEW_WAIT_MAX", "0.1")  # the live-view block serves 60 s for a reader, not a test
    code = compile(snippet.source, snippet.id, "exec")
    exec(code, {"__name__": "__docs__"})  # noqa: S102 - running the documentation is the test


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if s.no_gpu], ids=lambda s: s.id)
def test_blocks_marked_without_a_gpu_run_pasted_into_an_interpreter(snippet, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RXCUDA_VIEW_WAIT_MAX", "0.1")
    paste(snippet.source, run=True)


# -- names -----------------------------------------------------------------------------------------------
def _resolve(dotted: str):
    """The object a dotted name such as ``rxcuda.cuda.NullDriver`` or ``rxcuda.Block.from_kernel`` names.
    An example (``rxcuda.examples.particles``) is found, not imported: importing one runs it."""
    if dotted.startswith("rxcuda.examples."):
        if dotted.rsplit(".", 1)[1].isupper():  # rxcuda.examples.NAME: a placeholder for any example
            return dotted
        if importlib.util.find_spec(dotted) is None:
            raise ImportError(f"no module {dotted}")
        return dotted
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[: i + 1]))  # a submodule not imported yet
    return obj


def _aliases(file: str) -> dict[str, str]:
    """Names a file's python blocks bind to rxcuda modules and objects (``rx`` -> ``rxcuda.lang``)."""
    out = {"rxcuda": "rxcuda"}
    for s in SNIPPETS:
        if s.file != file:
            continue
        for node in ast.walk(ast.parse(s.own)):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("rxcuda"):  # `import rxcuda.tensor as rt`; `import rxcuda.kernels`
                        out[a.asname] = a.name if a.asname else None
                out.pop(None, None)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rxcuda"):
                out.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return out


def _dotted_uses(text: str, head: str) -> set[str]:
    """``head.a.b`` chains in the text (prose and code), as ``a.b``."""
    return set(re.findall(rf"(?<![\w.]){re.escape(head)}((?:\.[A-Za-z_]\w*)+)", text))


# checked on instances (an engine on the null driver, a block), where attributes set in __init__ exist
INSTANCES = ("engine", "block", "Frame", "Diagnostic", "Tier", "Block", "BlockBuilder", "NullDriver")


@pytest.mark.parametrize("file", sorted(FILES))
def test_every_rxcuda_import_in_the_python_blocks_exists(file):
    missing = []
    for alias, dotted in _aliases(file).items():
        try:
            _resolve(dotted)
        except (ImportError, AttributeError) as e:
            missing.append(f"{alias} = {dotted}: {e}")
    assert not missing


@pytest.mark.parametrize("file", sorted(FILES))
def test_every_name_used_through_rxcuda_or_an_alias_exists(file):
    """``rxcuda.X.Y`` anywhere on a page, and ``rx.sin`` where a block of it bound ``rx`` to rxcuda.lang."""
    aliases = _aliases(file)
    missing = []
    for alias in sorted(set(aliases) - set(INSTANCES)):
        for chain in sorted(_dotted_uses(FILES[file], alias)):
            dotted = aliases[alias] + chain
            try:
                _resolve(dotted)
            except (ImportError, AttributeError):
                missing.append(f"{alias}{chain}")
    assert not missing, f"{file} uses names that do not exist: {missing}"


def test_every_engine_and_block_attribute_the_pages_use_exists():
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
        missing = [f"{file}: {head}{chain}" for file, text in FILES.items() for head, obj in things.items()
                   for chain in _dotted_uses(text, head) if not hasattr(obj, chain.split(".")[1])]
    assert not missing, f"the pages use attributes that do not exist: {sorted(missing)}"


def test_the_kernels_the_blocks_name_are_shipped_and_no_block_needs_the_checkout():
    named = set()
    for s in SNIPPETS:
        named |= set(re.findall(r"""(?:from_kernel|kernels\.path)\(\s*["'](\w+)(?:\.\w+)?["']""", s.own))
        assert not re.search(r"""["']kernels/""", s.own), f"{s.id} names a file of the checkout (kernels/...)"
    assert named and named <= set(SHIPPED), sorted(named - set(SHIPPED))
    assert [n for n in SHIPPED if not (ROOT / "kernels" / f"{n}.ptx").is_file()] == []


@pytest.mark.parametrize("file", sorted(FILES))
def test_json_blocks_parse(file):
    for b in fenced_blocks(FILES[file]):
        if b.lang == "json":
            json.loads(b.text)



def test_cuda_blocks_compile_with_nvrtc():
    """The CUDA C++ the pages show compiles (NVRTC needs no GPU), and rxcuda reads its declaration."""
    import rxcuda

    blocks = [(file, b) for file, text in FILES.items() for b in fenced_blocks(text) if b.lang == "cuda"]
    assert blocks
    for file, b in blocks:
        code = rxcuda.compile_cuda(b.text, arch="sm_90", name=f"{file}:{b.line}")
        assert code.signature.params, f"{file}:{b.line}"
    # the annotations table's example reads as the page says: directions, a counter, defaults, block size
    collect = rxcuda.compile_cuda(next(b.text for _, b in blocks if "collect(" in b.text), arch="sm_90")
    assert [p.describe() for p in collect.signature.params] == [
        "f32* values (in)", "f32* kept (out)", "u32* count (counter)", "f32 threshold", "u32 capacity", "i32 n"]
    assert [p.default for p in collect.signature.params][3:] == [0.5, "size", "size"]
    assert collect.block_size == 128


def test_the_make_targets_the_pages_name_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = set()
    for text in FILES.values():  # `make X` in the prose, and make lines of the shell blocks
        named |= set(re.findall(r"`make ([a-z][\w-]*)", text))
        for b in fenced_blocks(text):
            if b.lang == "sh":
                named |= set(re.findall(r"^make ([a-z][\w-]*)", b.text, re.M))
    assert {"demo", "test", "docs"} <= named
    assert sorted(named - targets) == []

# -- the architecture page's layout ----------------------------------------------------------------------
# Folders the layout names that the code does not have yet (a move under way), each mapped to where its modules
# live until then; an entry goes when its folder lands.
MOVING: dict[str, str] = {}


def _layout() -> str:
    text = FILES["docs/architecture.md"]
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return next(b.text for b in fenced_blocks(section) if b.lang == "text")


def _layout_folders() -> list[str]:
    """The package folders the layout names: ``  name/`` lines inside ``rxcuda/``."""
    section = re.split(r"\n(?=\S)", _layout().split("\nrxcuda/", 1)[1], maxsplit=1)[0]
    named, parent = [], None
    for indent, name in re.findall(r"^( {2,4})(\w+)/", section, re.M):
        if len(indent) == 2:
            parent = name
            named.append(name)
        elif parent is not None:  # a folder inside the one above it: cuda/nodes
            named.append(f"{parent}/{name}")
    return named


def test_the_layout_names_every_folder_of_the_package():
    folders = {p.parent.relative_to(ROOT / "rxcuda").as_posix() for p in (ROOT / "rxcuda").rglob("__init__.py")
               if p.parent != ROOT / "rxcuda"}
    named = set(_layout_folders())
    moving_to = {old: new for new, old in MOVING.items()}
    unnamed = sorted(f for f in folders if f not in named and moving_to.get(f) not in named)
    assert unnamed == []


def test_the_layout_names_only_folders_that_exist_or_are_moving():
    named = _layout_folders()
    assert len(named) >= 9
    ghosts = [f for f in named if not (ROOT / "rxcuda" / f).is_dir() and f not in MOVING]
    assert ghosts == []
    landed = [f for f in MOVING if (ROOT / "rxcuda" / f / "__init__.py").is_file()]
    assert landed == [], f"rxcuda/{landed[0]}/ has landed: take it out of MOVING in this file"


# -- the site --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once for this module's checks: mkdocs build --strict (warnings are errors)."""
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]') builds the site")
    return build_site(tmp_path_factory.mktemp("site") / "site")


def test_the_site_builds_with_warnings_as_errors_and_loads_nothing_from_the_internet(site):
    assert (site / "index.html").is_file() and (site / "api.html").is_file()
    remote = set()
    for page in site.rglob("*.html"):
        remote |= set(re.findall(r'<(?:script|link|img)[^>]*(?:src|href)="(https?://[^"]+)"', page.read_text()))
    assert remote == set(), f"the site loads these from the internet: {sorted(remote)[:5]}"
    api = (site / "api.html").read_text()
    # docstring examples are fenced pycon code (tools/griffe_doctest.py): Pygments marks the prompts
    assert '<span class="gp">&gt;&gt;&gt; </span>' in api


def test_the_site_works_opened_from_disk(site):
    """Pages are files (no directory URLs, which a browser opening files shows as listings) and the search
    index is a script the pages load (tests/browser/test_site.py searches it in Chromium)."""
    assert not [p for p in site.rglob("index.html") if p.parent != site]
    links = set()
    for page in site.glob("*.html"):
        if page.name == "404.html":  # (a server's answer for any path: its links start at the site's root)
            continue
        links |= set(re.findall(r'href="([^"#:]*)(?:#[^"]*)?"', page.read_text()))
    assert not [link for link in links if link.endswith("/") or (link and not (site / link).exists())]
    assert (site / "search" / "search_index.js").is_file()  # what the pages load for search on file://
    # search runs in a Web Worker, which file:// pages start through a shim: the vendored copy, not unpkg's
    assert '<script src="assets/iframe-worker-shim.js">' in (site / "index.html").read_text()


def _public(cls) -> set[str]:
    """The public attributes of ``cls`` as Python sees them after ``import rxcuda`` (rxcuda.view's conveniences
    included), less those of bases outside rxcuda (object, enum, tuple, Mapping, ...)."""
    outside = set()
    for base in cls.__mro__[1:]:
        if not base.__module__.startswith("rxcuda"):
            outside |= set(dir(base))
    return {n for n in dir(cls) if not n.startswith("_")} - outside


def _held():
    """What users hold, by the name the API reference gives it."""
    import rxcuda
    import rxcuda.distributed

    names = ["Engine", "Block", "BlockBuilder", "Parameter", "PortHandle", "Composite", "CompositeInstance", "Frame",
             "Diagnostic", "AppliedUpdate", "BufferStats", "EngineStream", "GraphPlan", "Trace", "LiveView",
             "IsolatedEngine", "Fault"]
    held = {f"rxcuda.{n}": getattr(rxcuda, n) for n in names}
    held.update({f"rxcuda.distributed.{n}": getattr(rxcuda.distributed, n)
                 for n in ("Engine", "DistributedFrame", "Worker")})
    # what the engine's views hand back (engine.gl_buffer, gl_texture; rxcuda.view.widgets, read_trace, summarize)
    held.update({f"rxcuda.view.{n}": getattr(rxcuda.view, n)
                 for n in ("GLBuffer", "GLTexture", "Widgets", "TraceData", "TraceSummary")})
    return held


def test_the_api_reference_shows_every_public_member_of_what_users_hold(site):
    api = (site / "api.html").read_text()
    anchors = set(re.findall(r'id="(rxcuda[\w.]*)"', api))
    held = _held()
    assert [name for name in held if name not in anchors] == []
    missing = sorted(f"{name}.{m}" for name, cls in held.items() for m in _public(cls) if f"{name}.{m}" not in anchors)
    assert missing == [], f"the API reference leaves out {missing}"
    # the engine's views (rxcuda.engine._views) and streams (rxcuda.engine._streams), mixins, are there too
    engine = _public(held["rxcuda.Engine"])
    assert {"serve", "to_dot", "save_graph", "trace", "gl_buffer", "frames", "diagnostics"} <= engine


def _reference_entries() -> dict[str, bool]:
    """docs/api.md's ``::: name`` entries, and the classes a module's entry lists (``members: [...]``): name ->
    whether its members include the inherited ones (the option ``inherited_members: true``), as mkdocstrings
    renders them."""
    blocks: dict[str, list[str]] = {}
    name = None
    for line in (ROOT / "docs" / "api.md").read_text().splitlines():
        if line.startswith("::: "):
            name = line[4:].strip()
            blocks[name] = []
        elif name is not None and (line.startswith(" ") or not line):
            blocks[name].append(line)
        else:
            name = None
    entries = {n: "inherited_members: true" in "\n".join(lines) for n, lines in blocks.items()}
    for module, lines in blocks.items():
        listed = re.search(r"members: \[([^\]]*)\]", "\n".join(lines))
        if listed:
            members = [m.strip() for m in listed.group(1).replace("\n", " ").split(",")]
        else:  # a module's entry lists all it exports
            members = list(getattr(importlib.import_module(module), "__all__", ())) if _is_module(module) else []
        for member in members:
            entries.setdefault(f"{module}.{member}", entries[module])
    return entries


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # (a class: rxcuda.Engine's parent is no package)
        return False


def test_every_public_method_is_declared_where_the_api_reference_reads_it():
    """The API reference is read from the source (griffe, statically: nothing imported), so a public member that
    exists only at run time (a method attached to a class after it was made) is missing from it. Every public
    member of what users hold -- the Engine, Block, Parameter, the distributed Engine, ... -- is declared on the
    class or on a base that docs/api.md lists it with (``inherited_members: true``)."""
    griffe = pytest.importorskip("griffe", reason="the docs extra (pip install -e '.[docs]') reads the source")
    package = griffe.load("rxcuda", search_paths=[str(ROOT)], resolve_aliases=True, resolve_external=False)
    entries = _reference_entries()
    held = _held()
    assert {"rxcuda.Engine", "rxcuda.Block", "rxcuda.Parameter", "rxcuda.distributed.Engine"} <= set(held)
    missing = []
    for name, cls in held.items():
        assert name in entries, f"docs/api.md has no entry for {name}"
        obj = package[name.removeprefix("rxcuda.")]
        obj = obj.final_target if isinstance(obj, griffe.Alias) else obj
        shown = set(obj.all_members if entries[name] else obj.members)
        missing += [f"{name}.{m}" for m in sorted(_public(cls)) if m not in shown]
    assert missing == [], f"public at run time, but not declared where the API reference reads them: {missing}"
    # the engine's views are its own methods (rxcuda.engine._views), not attached by rxcuda.view
    from rxcuda.engine._views import EngineViews

    for method in ("serve", "to_dot", "save_graph", "save_driver_graph", "trace", "gl_buffer", "gl_texture"):
        assert method in EngineViews.__dict__ and method in _public(held["rxcuda.Engine"]), method


# modules that still attach methods to a class they import, each with why (the test fails once one no longer does:
# then take it out). Tensor's NumPy-style methods (argmax, prod, std, ...) are missing from the API reference.
KNOWN_ATTACHERS = {
    "rxcuda/tensor/_numpy.py": "Tensor's NumPy-style methods are attached where their functions are made: declaring "
                               "them on Tensor (_tensor.py) would import _numpy, which imports _tensor (a circle)",
}


def _attached(path) -> list[str]:
    """``Class.name = function`` or ``setattr(Class, ...)``, at the top of a module or in a function, for a class the
    module imports: ``"line: Class.name"``."""
    tree = ast.parse(path.read_text())
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}

    def a_class(node) -> bool:
        return isinstance(node, ast.Name) and node.id in imported and node.id[:1].isupper()

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Lambda)):
            found += [f"{node.lineno}: {t.value.id}.{t.attr}" for t in node.targets
                      if isinstance(t, ast.Attribute) and a_class(t.value)]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and node.args and a_class(node.args[0])):
            found.append(f"{node.lineno}: {node.args[0].id}.<{ast.unparse(node.args[1])}>")
    return found


def test_no_module_attaches_methods_to_a_class_of_another():
    """``Class.name = function`` or ``setattr(Class, name, function)`` for a class the module imports: how
    rxcuda.view used to add the engine's conveniences. The class declares its methods (rxcuda.model._provided
    says how one whose work is done above it calls that work)."""
    found = {}
    for path in sorted((ROOT / "rxcuda").rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        found.update({f"{where}:{line}": where for line in _attached(path)})
    assert [f for f, where in found.items() if where not in KNOWN_ATTACHERS] == []
    assert sorted(set(KNOWN_ATTACHERS) - set(found.values())) == [], "attaches no more: take it out of KNOWN_ATTACHERS"


def test_the_attach_check_sees_both_spellings(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from ._engine import Engine, helper\nfrom . import _tensor as T\n"
                    "Engine.serve = helper\nEngine.x = lambda self: 1\nhelper.y = helper\n"
                    "def f():\n    setattr(Engine, 'to_dot', helper)\n    Engine.z = 3\n")
    assert _attached(path) == ["3: Engine.serve", "4: Engine.x", "7: Engine.<'to_dot'>"]


def test_doctest_fences_wrap_examples_and_drop_directives():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_griffe_doctest", ROOT / "tools" / "griffe_doctest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = "Intro.\n\n>>> x = [1, 2][:1]   # doctest: +SKIP\n>>> x\n[1]\n\nAfter.\n\n```python\n>>> kept\n```"
    assert module.fence_doctests(text) == (
        "Intro.\n\n```pycon\n>>> x = [1, 2][:1]\n>>> x\n[1]\n```\n\nAfter.\n\n```python\n>>> kept\n```")

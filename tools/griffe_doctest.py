"""A Griffe extension for the API reference (mkdocs.yml loads it through mkdocstrings): the docstrings' doctest
examples (``>>>`` lines and the output after them, up to a blank line) become fenced ``pycon`` code blocks,
without their ``# doctest:`` directives. Written as plain text they would read as one paragraph, and
``[a][0]`` in them as a Markdown reference link."""

from __future__ import annotations

import re

import griffe

_DIRECTIVE = re.compile(r"\s*#\s*doctest:.*$")


def fence_doctests(text: str) -> str:
    out: list[str] = []
    in_fence = in_example = False
    indent = ""
    for line in text.split("\n"):
        stripped = line.lstrip()
        if in_example and (not stripped or not line.startswith(indent)):
            out.append(f"{indent}```")
            in_example = False
        if stripped.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and not in_example and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}```pycon")
            in_example = True
        out.append(_DIRECTIVE.sub("", line) if in_example else line)
    if in_example:
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)

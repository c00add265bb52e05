"""A Griffe extension for the API reference (mkdocs.yml loads it through mkdocstrings): the methods that
``rxcuda.view`` installs on classes below it (``Engine.serve``, ``Engine.to_dot``, ``GraphPlan.to_dot``, ...)
are shown as members of those classes, where users call them.

They are installed at import time because the engine may not import the view (folders import only downward,
docs/architecture.md); Griffe reads the source without importing it, so it would not see them. This reads the
installers themselves: every ``install()`` function of ``rxcuda/view`` whose body assigns ``Class.name = function``
adds ``function`` (its signature and docstring) to ``Class`` under ``name``. The installers stay the one list;
tests/unit/test_docs.py checks the rendered page against the live classes.
"""

from __future__ import annotations

import ast

import griffe

PACKAGE = "rxcuda"
INSTALLERS = "view"  # the subpackage whose install() functions attach methods to lower classes


def installed(source: str) -> list[tuple[str, str, str]]:
    """``(class, name, function)`` for each ``Class.name = function`` in the source's ``install()`` functions."""
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == "install":
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                        and isinstance(target := stmt.targets[0], ast.Attribute)
                        and isinstance(target.value, ast.Name) and isinstance(stmt.value, ast.Name)):
                    out.append((target.value.id, target.attr, stmt.value.id))
    return out


def _method(fn: griffe.Function, name: str, cls: griffe.Class) -> griffe.Function:
    method = griffe.Function(name, lineno=fn.lineno, endlineno=fn.endlineno, parameters=fn.parameters,
                             returns=fn.returns, decorators=fn.decorators, parent=cls)
    if fn.docstring is not None:
        method.docstring = griffe.Docstring(fn.docstring.value, lineno=fn.docstring.lineno,
                                            endlineno=fn.docstring.endlineno, parent=method)
    return method


class InstalledMethods(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        if pkg.name != PACKAGE or INSTALLERS not in pkg.members:
            return
        for module in pkg[INSTALLERS].modules.values():
            if module.filepath is None or isinstance(module.filepath, list):
                continue
            for cls_name, name, fn_name in installed(module.filepath.read_text()):
                if name.startswith("_") or cls_name not in module.members or fn_name not in module.members:
                    continue  # private conveniences (_repr_html_) stay out of the reference
                cls = module[cls_name]  # the import alias: its target is the class itself
                cls = cls.final_target if isinstance(cls, griffe.Alias) else cls
                fn = module[fn_name]
                if isinstance(cls, griffe.Class) and isinstance(fn, griffe.Function):
                    cls.set_member(name, _method(fn, name, cls))

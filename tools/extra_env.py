"""What an environment holding rxcuda with exactly some extras has: the site-packages entries of the distributions
``pip install '.[EXTRA,...]'`` would install (rxcuda's own requirements and those of the extras, and theirs, on and
on), found among those installed in this Python's environment. tools/check_wheel.sh links them into a fresh
environment per extra, so a documentation block that names its extra runs with that and nothing more.

usage: python tools/extra_env.py [EXTRA ...]     prints one entry name a line (``numpy``, ``numpy-2.2.6.dist-info``)
"""

from __future__ import annotations

import pathlib
import sys
import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """rxcuda's requirements with ``extras``, the extras it names of itself (``dev`` names ``docs``) unfolded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"extra_env: rxcuda has no extra {unknown[0]!r} (extras: {', '.join(sorted(optional))})")
    out, todo, seen = [Requirement(r) for r in project["dependencies"]], list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "rxcuda":
                todo += sorted(req.extras)
            else:
                out.append(req)
    return out


def distributions(extras: tuple[str, ...]) -> list[metadata.Distribution]:
    """The installed distributions ``pip install '.[extras]'`` would bring (besides rxcuda), dependencies included.
    Exits with a message naming a requirement that this environment lacks."""
    found: dict[str, metadata.Distribution] = {}
    todo = [(req, "rxcuda") for req in _requirements(extras)]
    while todo:
        req, by = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        wanted = found.get(name)
        if wanted is None:
            try:
                wanted = found[name] = metadata.distribution(req.name)
            except metadata.PackageNotFoundError:
                raise SystemExit(f"extra_env: {req} (required by {by}) is not installed in {sys.prefix}") from None
            for text in wanted.requires or ():
                sub = Requirement(text)
                if sub.marker is None or sub.marker.evaluate({"extra": ""}):
                    todo.append((sub, name))
        for extra in req.extras:  # requirement[extra]: what that extra of it adds
            for text in wanted.requires or ():
                sub = Requirement(text)
                if sub.marker is not None and sub.marker.evaluate({"extra": extra}) \
                        and not sub.marker.evaluate({"extra": ""}):
                    todo.append((sub, f"{name}[{extra}]"))
    return list(found.values())


def entries(extras: tuple[str, ...]) -> list[str]:
    """The top-level site-packages names (packages, modules, .dist-info folders, .pth files) of those
    distributions. A folder several distributions share (``nvidia``, ``cuda``) is named once."""
    names: set[str] = set()
    for dist in distributions(extras):
        files = dist.files
        if files is None:
            raise SystemExit(f"extra_env: {dist.metadata['Name']} lists no files (no RECORD): cannot link it")
        names |= {f.parts[0] for f in files if f.parts and f.parts[0] != ".."}
    return sorted(names)


if __name__ == "__main__":
    print("\n".join(entries(tuple(sys.argv[1:]))))

"""Where rxcuda keeps what it builds across processes (compiled kernels, the compiled parameter path)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_DIR = "RXCUDA_CACHE_DIR"


def cache_dir() -> Path:
    """Where compiled code is cached: ``$RXCUDA_CACHE_DIR``, else ``$XDG_CACHE_HOME/rxcuda`` or
    ``~/.cache/rxcuda`` (``%LOCALAPPDATA%\\rxcuda`` on Windows)."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    if os.name == "nt":
        root = os.environ.get("LOCALAPPDATA")
        return (Path(root) if root else Path.home() / "AppData" / "Local") / "rxcuda"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rxcuda"

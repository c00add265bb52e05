"""Where compiled code is kept across processes: cuda.core's ``FileStreamProgramCache`` (atomic writes;
safe for concurrent processes) under :func:`cache_dir`, keyed by ``make_program_cache_key`` (source,
options, target, NVRTC version) plus a digest of the headers the source includes from disk."""

from __future__ import annotations

from pathlib import Path

import attrs

from ..cuda._paths import cache_dir

__all__ = ["CacheStats", "cache_dir", "disk_key", "entries_info", "open_disk_cache"]  # cache_dir: from cuda/

_CACHE_CAP_BYTES = 1 << 30  # a soft cap; cuda.core evicts least recently read entries beyond it


@attrs.frozen
class CacheStats:
    """Counts since the compiler was made (or its stats reset). ``compile_seconds`` is spent in NVRTC."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    compile_seconds: float = 0.0

    @property
    def hits(self) -> int:
        return self.memory_hits + self.disk_hits

    @property
    def requests(self) -> int:
        return self.hits + self.misses


def open_disk_cache(root: Path):
    """The program cache in ``root`` (created); raises OSError where it cannot be made."""
    from cuda.core.utils import FileStreamProgramCache

    root.mkdir(parents=True, exist_ok=True)
    return FileStreamProgramCache(root, max_size_bytes=_CACHE_CAP_BYTES)


def disk_key(source: str, target: str, opts, extra: bytes) -> bytes:
    """The cache key of one compile; ``extra`` is the digest of the headers included from disk."""
    from cuda.core.utils import make_program_cache_key

    return make_program_cache_key(code=source, code_type="c++", options=opts, target_type=target,
                                  extra_digest=extra)


def entries_info(directory: Path | None) -> dict[str, object]:
    """Directory, number of entries and bytes on disk of a cache directory."""
    entries = 0
    size = 0
    if directory is not None and (directory / "entries").is_dir():
        for p in (directory / "entries").rglob("*"):
            if p.is_file():
                entries += 1
                size += p.stat().st_size
    return {"directory": str(directory) if directory else None, "entries": entries, "bytes": size}

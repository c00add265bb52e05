"""The isolated engine's reads, on your process's side: a port's bytes come from the GPU process through shared
memory, and a large read comes back as an array *in* that memory, with no copy here.

Measured on an H100 (``bench/faults.py``, 4 MiB): the in-process engine's ``read`` is one pageable copy from the
device (~390 µs); the isolated engine's was the GPU process's copy into a page-locked shared file and then a
copy of that file into a new array here (~560 µs, of which that second copy, page faults of the new array
included, took most). So a read of at least :data:`ZERO_COPY_MIN` bytes without ``out=`` is offered a *slab*: a
shared-memory file made here, its pages reserved (``posix_fallocate``: a full ``/dev/shm`` is refused here, not
met as a bus error later) and mapped (``MAP_POPULATE``), that the GPU process maps and page-locks once and copies
the port straight into (the DMA engine's copy on a GPU). The array returned is that memory: the read costs the
device's copy and the answer through the clock's pipe.

A slab is handed out again only once no array of it is left: the pool keeps the slab's mapping object and the
number of references it holds itself, and every array (and every view of one) made from it holds one more, so
``sys.getrefcount`` tells when the user dropped them all. A port has at most :data:`SLABS_PER_PORT` slabs; a read
that finds them all held, a first read of a port (its size is learnt from it), a small one, or one into ``out=``
goes the other way: into the GPU process's own page-locked file, then copied out here
(``_board.SharedArrays.take``). An array handed out stays valid after the engine closes and after the GPU
process is replaced: the mapping lives as long as an array of it (the files are unlinked at close). (A process
forked from yours shares the mapping: an array it inherited is not counted here, so a slab you no longer hold
may be written while that process still reads its copy of the array; copy such an array before forking.)

>>> import numpy as np
>>> from rxcuda.model._describe import PortRef
>>> slabs = ReadSlabs("rxcuda-doctest-readback")
>>> ref = PortRef(1, "out")
>>> slabs.offer(ref) is None                         # nothing known of the port yet: the copy path
True
>>> slabs.learn(ref, 1 << 20)
>>> path, room = slabs.offer(ref)
>>> room >= 1 << 20
True
>>> a = slabs.array(path, (1 << 18,), np.dtype(np.float32))    # what the GPU process filled
>>> path2, _ = slabs.offer(ref); path2 != path           # held: another slab
True
>>> del a; slabs.offer(ref)[0] == path                   # dropped: handed out again
True
>>> slabs.close()
"""

from __future__ import annotations

import contextlib
import itertools
import math
import mmap
import os
import re
import sys

import numpy as np

from ..model._describe import PortRef
from ._board import board_dir

ZERO_COPY_MIN = 64 << 10  # a read this large or larger comes back in a slab (a smaller one is copied: cheap)
SLABS_PER_PORT = 4  # arrays of one port the user may hold before reads of it are copied again
_PAGE = mmap.PAGESIZE
_count = itertools.count()


class _Slab:
    """One shared-memory file made here and mapped for good; ``held()`` while an array of it is alive."""

    def __init__(self, path: str, size: int):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, size)  # the pages exist now (ENOSPC here, not SIGBUS in a copy)
            except OSError as e:
                if e.errno not in (95, 22):  # EOPNOTSUPP / EINVAL: a file system without it: sized only
                    raise
                os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        os.close(fd)
        self.path, self.size = path, size
        self._refs = sys.getrefcount(self.mm)  # the pool's own references: an array of it adds one

    def held(self) -> bool:
        return sys.getrefcount(self.mm) > self._refs

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(BufferError):  # an array of it is alive: the mapping goes with the last one
            self.mm.close()


class ReadSlabs:
    """Your process's slabs, per port, named ``<prefix>-<n>`` in :func:`~._board.board_dir` (``prefix``:
    ``rxcuda-<session>-...``, so that ``remove_boards(session)`` removes them too)."""

    def __init__(self, prefix: str):
        self.prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", prefix)
        self._ports: dict[PortRef, list[_Slab]] = {}
        self._paths: dict[str, _Slab] = {}
        self._sizes: dict[PortRef, int] = {}  # port -> the bytes its last read had
        self.refused = False  # a slab could not be made (shared memory full): reads are copied from then on

    def learn(self, ref: PortRef, nbytes: int) -> None:
        """What a read of ``ref`` returned (its size decides the next one's slab)."""
        self._sizes[ref] = nbytes

    def offer(self, ref: PortRef) -> tuple[str, int] | None:
        """(path, bytes) of a slab the next read of ``ref`` may land in, or None: read it the copying way (its
        size is not known yet, it is small, every slab of it is held, or shared memory is full)."""
        want = self._sizes.get(ref)
        if want is None or want < ZERO_COPY_MIN or self.refused:
            return None
        slabs = self._ports.setdefault(ref, [])
        for s in slabs:
            if s.size >= want and not s.held():
                return s.path, s.size
        small = next((s for s in slabs if not s.held()), None)  # the port grew: a free slab too small goes
        if small is not None:
            slabs.remove(small)
            del self._paths[small.path]
            small.close()
        if len(slabs) >= SLABS_PER_PORT:
            return None
        path = os.path.join(board_dir(), f"{self.prefix}-{next(_count)}")
        try:
            slab = _Slab(path, -(-want // _PAGE) * _PAGE)
        except OSError:
            self.refused = True
            return None
        slabs.append(slab)
        self._paths[path] = slab
        return path, slab.size

    def array(self, path: str, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
        """The array of ``shape`` and ``dtype`` the GPU process copied into the slab at ``path`` (the user's
        from now on); None where ``path`` is no slab of this pool (the GPU process's own file: copy it out)."""
        slab = self._paths.get(path)
        if slab is None:
            return None
        return np.frombuffer(slab.mm, dtype, math.prod(shape)).reshape(shape)

    def forget(self, blocks: set[int]) -> None:
        """Drop the slabs of the ports of ``blocks`` (removed from the pipeline)."""
        for ref in [r for r in self._ports if r.block in blocks]:
            for s in self._ports.pop(ref):
                del self._paths[s.path]
                s.close()
        for ref in [r for r in self._sizes if r.block in blocks]:
            del self._sizes[ref]

    def close(self) -> None:
        """Unlink every slab (arrays of them stay valid: their mappings go with them)."""
        for s in self._paths.values():
            s.close()
        self._ports.clear()
        self._paths.clear()

"""Loading a kernel file (``.ptx``, ``.cubin``, ``.fatbin``) and its JSON sidecar into a :class:`KernelCode`.

The kernel's real parameters come from the code itself: the ``.entry`` list of a PTX file, or the
``EIATTR_KPARAM_INFO`` records of a cubin's ``.nv.info.<entry>`` section (the same records the driver's
``cuFuncGetParamInfo`` reads). The sidecar ``<stem>.json`` beside the file adds names and meaning and is
checked against them. Only a fatbin whose cubins are compressed (or absent) cannot be read without the
driver; it then needs a sidecar with ``params``, and the engine should check those against
``Kernel.arguments_info`` once the module is loaded.

A file loaded before is not read and parsed again while it and its sidecar are unchanged (``_FileCache``:
same path, same ``stat`` stamp, and the same bytes where the stamp alone cannot tell): declaring a thousand
blocks from one path reads it once, and a saved edit is read again (hot reload sees the new content).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections import OrderedDict
from pathlib import Path

from ..model._describe import CodeFormat, KernelCode, KernelParam, KernelSignature
from ..model._errors import KernelFileError
from ._paths import missing_file_message, shipped_hint
from ._ptx import check_ptx, parse_ptx, signature_from_ptx
from ._sidecar import Sidecar, merge, read_sidecar

_FORMATS: dict[str, CodeFormat] = {".ptx": "ptx", ".cubin": "cubin", ".fatbin": "fatbin"}
FILE_SUFFIXES = tuple(_FORMATS)  # the same, for str.endswith (load_source's fast test of a path)


def find_sidecar(path: str | Path) -> Path | None:
    """The sidecar ``<stem>.json`` beside a kernel file, or ``None`` when there is none."""
    candidate = Path(path).with_suffix(".json")
    return candidate if candidate.is_file() else None


def load_kernel_file(path: str | Path, entry: str | None = None) -> KernelCode:
    """Load one entry point of a ``.ptx``/``.cubin``/``.fatbin`` file, with its sidecar if there is one.

    The entry is the sidecar's ``entry``, else ``entry``, else the file's only entry point; asking for an
    entry other than the sidecar's is an error (its parameters would not match). ``block_size`` and
    ``shared_mem`` come from the sidecar (256 and 0 without one).

    >>> code = load_kernel_file("kernels/vector_add.ptx")
    >>> [p.describe() for p in code.signature.params]
    ['f32* a (in)', 'f32* b (in)', 'f32* out (out)', 'i32 n']

    Raises :class:`KernelFileError` (``.path`` set) when the file is missing or malformed, the entry is
    ambiguous or absent, or the sidecar disagrees with the kernel.

    Loading an unchanged file again returns the same KernelCode without reading it (see ``_FileCache``).
    """
    return _files.load(path, entry)


def _load_kernel_file(path: str | Path, entry: str | None) -> KernelCode:
    path = Path(path)
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        hint = " (a .cu source is compiled at run time, not loaded as a file)" if path.suffix == ".cu" else ""
        kind = path.suffix or "(none)"
        raise KernelFileError(
            f"{path}: unsupported kernel file type {kind!r}{hint}; use .ptx, .cubin or .fatbin",
            path=str(path),
        )
    image = _read(path)
    sidecar_path = find_sidecar(path)
    sidecar = read_sidecar(sidecar_path) if sidecar_path else None
    if fmt == "ptx":
        signature = _ptx_signature(path, image, sidecar, entry)
    else:
        signature = _binary_signature(path, image, fmt, sidecar, entry)
    return KernelCode(
        entry=signature.entry,
        image=image,
        format=fmt,
        signature=signature,
        origin=str(path),
        block_size=sidecar.block_size if sidecar else 256,
        shared_mem=sidecar.shared_mem if sidecar else 0,
    )


# A stamp may miss a change only while the file's modification time is this close to when it was checked:
# file systems keep times in ticks (a few ms on Linux, 2 s on FAT), so an edit within the same tick and of the
# same size keeps the stamp. Such an entry is confirmed by comparing bytes instead (git's "racy clean" rule).
_RACY_NS = 3_000_000_000


def _stamp(path: str) -> tuple[int, int, int, int] | None:
    """(device, inode, mtime_ns, size) of ``path``; None when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def _last_write(stamp: tuple, side_stamp: tuple | None) -> int:
    """When the kernel file or its sidecar was last written (ns), from their ``_stamp``s: what the racy window
    of the file cache is measured from."""
    return max(stamp[2], side_stamp[2]) if side_stamp else stamp[2]


def _racy(stamp: tuple, side_stamp: tuple | None, when: int) -> bool:
    """Whether the kernel file or its sidecar was last written within the racy window before ``when`` (ns): an
    entry checked then may hide an edit behind an unchanged stamp, so only its bytes confirm it."""
    return _last_write(stamp, side_stamp) >= when - _RACY_NS


def _bytes_of(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


class _FileCache:
    """Kernel files loaded before, by (path as given, absolute path, entry): the KernelCode, the stamps of the
    file and of its sidecar when loaded, and the sidecar's bytes. A hit costs two ``stat`` calls; a changed
    stamp reads and parses again. Thread-safe (a lock around the table; two threads missing at once both
    parse, and the last one's result stays). Holds the ``limit`` most recently used files."""

    def __init__(self, limit: int = 256):
        self.limit = limit
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, tuple] = OrderedDict()
        self._where: dict[tuple[str, str], tuple[str, str]] = {}  # (cwd or "", path as given) -> (file, sidecar)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._where.clear()
            self.hits = self.misses = 0

    def load(self, path: str | Path, entry: str | None) -> KernelCode:
        given = os.fspath(path)
        if type(given) is not str:
            return _load_kernel_file(path, entry)  # the loader's message for bytes
        # the absolute paths, worked out once per path as given and working folder (abspath and splitext cost more
        # than a dict lookup: 1000 blocks declared from one file ~2 ms)
        where = ("" if os.path.isabs(given) else os.getcwd(), given)
        found_where = self._where.get(where)
        if found_where is None:
            if os.path.splitext(given)[1].lower() not in _FORMATS:
                return _load_kernel_file(path, entry)  # the loader's message for an unsupported type
            if len(self._where) >= 4096:
                self._where.clear()
            full = os.path.abspath(given)
            found_where = self._where[where] = (full, os.path.splitext(full)[0] + ".json")
        full, side = found_where
        key = (given, full, entry)
        checked = time.time_ns()
        stamp, side_stamp = _stamp(full), _stamp(side)
        if stamp is None:
            return _load_kernel_file(path, entry)  # missing: the loader says so, with *did you mean*
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                # the usual hit, decided here: both stamps as recorded, and confirmed long enough ago that an
                # edit within the file system's tick cannot hide behind them (else _still, outside the lock)
                if found[1] == stamp and found[2] == side_stamp and not _racy(stamp, side_stamp, found[4]):
                    self.hits += 1
                    return found[0]
        if found is not None and self._still(found, stamp, side_stamp, full, side, checked):
            with self._lock:
                self.hits += 1
                if _racy(stamp, side_stamp, found[4]) and not _racy(stamp, side_stamp, checked):
                    # confirmed by its bytes, now long enough after its last write: the stamp suffices from now on
                    self._entries[key] = (*found[:4], checked)
            return found[0]
        code = _load_kernel_file(path, entry)
        side_bytes = _bytes_of(side) if side_stamp is not None else None
        with self._lock:
            self.misses += 1
            self._entries[key] = (code, stamp, side_stamp, side_bytes, checked)
            self._entries.move_to_end(key)
            while len(self._entries) > self.limit:
                self._entries.popitem(last=False)
        return code

    def _still(self, found: tuple, stamp, side_stamp, full: str, side: str, checked: int) -> bool:
        """Whether a cached entry still holds what the files hold now."""
        code, was, side_was, side_bytes, when = found
        if stamp != was or side_stamp != side_was:
            return False
        if not _racy(stamp, side_stamp, when):
            return True
        # modified close to when the entry was made: an edit in the same tick would keep the stamp
        return _bytes_of(full) == code.image and (side_stamp is None or _bytes_of(side) == side_bytes)


_files = _FileCache()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise KernelFileError(_missing_message(path), path=str(path)) from None
    except IsADirectoryError:
        raise KernelFileError(f"{path}: is a folder, not a kernel file", path=str(path)) from None
    except OSError as e:
        raise KernelFileError(f"{path}: cannot read: {e.strerror or e}", path=str(path)) from None


def _missing_message(path: Path) -> str:
    msg = missing_file_message(path, _FORMATS)
    source = path.with_suffix(".cu")
    if path.parent.is_dir() and source.is_file():
        msg += f" ({source.name} is there: build it with nvcc -ptx -arch=compute_75 {source.name})"
    else:
        msg += shipped_hint(path)
    return msg


def _choose_entry(path: Path, names: list[str], sidecar: Sidecar | None, entry: str | None) -> str:
    if sidecar is not None and sidecar.entry is not None:
        if entry is not None and entry != sidecar.entry:
            raise KernelFileError(
                f"{path}: entry '{entry}' was asked for, but the sidecar {sidecar.path} describes "
                f"'{sidecar.entry}'; load '{sidecar.entry}', or give '{entry}' a kernel file of its own",
                path=str(path),
            )
        return sidecar.entry
    if entry is not None:
        return entry
    if len(names) == 1:
        return names[0]
    if not names:
        raise KernelFileError(f"{path}: the file has no kernel entry point (no __global__ function)",
                              path=str(path))
    raise KernelFileError(
        f"{path}: the file has {len(names)} entry points ({', '.join(names)}); pass entry=... or set "
        "'entry' in the sidecar",
        path=str(path),
    )


def _ptx_signature(path: Path, image: bytes, sidecar: Sidecar | None, entry: str | None) -> KernelSignature:
    try:
        text = image.decode("utf-8")
    except UnicodeDecodeError:
        raise KernelFileError(f"{path}: not a text file; a .ptx file is PTX assembly text",
                              path=str(path)) from None
    check_ptx(text, str(path))
    names = list(parse_ptx(text, str(path)))
    chosen = _choose_entry(path, names, sidecar, entry)
    signature = signature_from_ptx(text, chosen, str(path))
    return merge(sidecar, signature) if sidecar else signature


def _binary_signature(
    path: Path, image: bytes, fmt: CodeFormat, sidecar: Sidecar | None, entry: str | None
) -> KernelSignature:
    kernels = cubin_params(image) if fmt == "cubin" else fatbin_params(image)
    if kernels is None:
        raise KernelFileError(f"{path}: not a cubin (no 64-bit ELF header); build it with nvcc -cubin",
                              path=str(path))
    names = list(kernels)
    chosen = _choose_entry(path, names, sidecar, entry) if names else None
    if chosen is not None and chosen not in kernels:
        raise KernelFileError(f"{path}: no entry '{chosen}'; entries: {', '.join(names)}", path=str(path))
    sizes = kernels.get(chosen) if chosen is not None else None
    if sizes is None:
        # A compressed fatbin (or records we cannot read): only the driver can tell the parameters.
        if sidecar is None or sidecar.params is None:
            raise KernelFileError(
                f"{path}: the kernel parameters in this {fmt} cannot be read without loading it (it is "
                f"compressed, or holds only PTX); write a sidecar {path.stem}.json with 'entry' and "
                "'params', or load the .ptx or .cubin instead",
                path=str(path),
            )
        chosen = chosen or entry or sidecar.entry
        if chosen is None:
            raise KernelFileError(f"{path}: cannot list the entry points of this {fmt}; set 'entry' in the "
                                  "sidecar or pass entry=...", path=str(path))
        return sidecar.signature(chosen)
    signature = _signature_from_sizes(chosen, sizes)
    return merge(sidecar, signature) if sidecar else signature


def _signature_from_sizes(entry: str, sizes: tuple[int, ...]) -> KernelSignature:
    # Read as PTX is read: 8 bytes may be a pointer; anything else is a value of unknown type.
    out = []
    for i, size in enumerate(sizes):
        if size == 8:
            out.append(KernelParam(name=f"arg{i}", kind="pointer", size=8, direction="inout", align=8))
        else:
            align = size if size in (1, 2, 4) else 0  # 0: unknown (a struct's alignment is not recorded)
            out.append(KernelParam(name=f"arg{i}", kind="scalar", size=size, align=align))
    return KernelSignature(entry=entry, params=tuple(out))


# --- cubin (ELF) -----------------------------------------------------------------------------------------
# .nv.info.<entry> holds records: u8 format, u8 attribute, then a value. Format 4 (EIFMT_SVAL) is followed
# by a u16 length; attribute 0x17 (EIATTR_KPARAM_INFO) is one per parameter: u32 index, u16 ordinal,
# u16 offset, u32 flags with the size in bits 18..31. The layout is NVIDIA's, undocumented but stable
# (cuobjdump -elf prints it); anything unexpected makes the kernel "unreadable", never misread.
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
_EIATTR_KPARAM_INFO = 0x17


def cubin_params(image: bytes) -> dict[str, tuple[int, ...] | None] | None:
    """Each kernel of a cubin mapped to its parameter sizes in order (``None`` for a kernel whose records
    cannot be read); ``None`` if the image is not a 64-bit ELF file."""
    sections = _elf_sections(image)
    if sections is None:
        return None
    kernels: dict[str, tuple[int, ...] | None] = {}
    for name, data in sections.items():
        # Every kernel has .nv.info.<name> (even one without parameters); device functions have none.
        entry = name[len(".nv.info.") :]
        if name.startswith(".nv.info.") and ".text." + entry in sections:
            kernels[entry] = _kparam_sizes(data)
    return kernels


def fatbin_params(image: bytes) -> dict[str, tuple[int, ...] | None]:
    """The kernels of every uncompressed cubin inside a fatbin (empty when all are compressed)."""
    kernels: dict[str, tuple[int, ...] | None] = {}
    start = image.find(b"\x7fELF")
    while start >= 0:
        for name, sizes in (cubin_params(image[start:]) or {}).items():
            if kernels.get(name) is None:
                kernels[name] = sizes
        start = image.find(b"\x7fELF", start + 4)
    return kernels


def _elf_sections(image: bytes) -> dict[str, bytes] | None:
    if len(image) < 64 or image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        return None  # not a 64-bit little-endian ELF
    try:
        shoff = struct.unpack_from("<Q", image, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
        headers = []
        for i in range(shnum):
            name, _typ, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", image, shoff + i * shentsize)
            headers.append((name, off, size))
        str_off = headers[shstrndx][1]
        sections = {}
        for name_off, off, size in headers:
            end = image.index(b"\0", str_off + name_off)
            sections[image[str_off + name_off : end].decode("ascii", "replace")] = image[off : off + size]
        return sections
    except (struct.error, IndexError, ValueError):
        return None


def _kparam_sizes(info: bytes) -> tuple[int, ...] | None:
    """Parameter sizes from one .nv.info.<entry> section, by ordinal; ``None`` if it cannot be read."""
    by_ordinal: dict[int, int] = {}
    i = 0
    while i + 2 <= len(info):
        fmt, attr = info[i], info[i + 1]
        if fmt == _EIFMT_SVAL:
            if i + 4 > len(info):
                return None
            (length,) = struct.unpack_from("<H", info, i + 2)
            if attr == _EIATTR_KPARAM_INFO:
                if length < 12 or i + 4 + length > len(info):
                    return None
                _index, ordinal, _offset, flags = struct.unpack_from("<IHHI", info, i + 4)
                by_ordinal[ordinal] = (flags >> 18) & 0x3FFF
            i += 4 + length
        elif fmt in (_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL):
            i += 4  # fixed-size records are 4 bytes (format, attribute, 2 value/pad bytes)
        else:
            return None  # a record format we do not know the length of: stop rather than misread
    if sorted(by_ordinal) != list(range(len(by_ordinal))):
        return None
    return tuple(by_ordinal[k] for k in range(len(by_ordinal)))

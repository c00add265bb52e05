"""OpenGL interop on the CPU device: the graphics-resource calls of :class:`~rxcuda.cuda._cpu.CpuDriver`.

On a GPU, a GL buffer registered with ``cuGraphicsGLRegisterBuffer`` *is* device memory: mapped, a kernel writes
the vertices GL draws. The CPU device's memory is host memory, which GL cannot draw from, so a registered buffer
gets a host copy (an allocation of the CPU device, at a stable address while the buffer keeps its size):

- mapping (``cuGraphicsMapResources``) hands out the host copy's address; a buffer registered without
  ``WRITE_DISCARD`` is first read back from GL into it (``glGetBufferSubData``), as its contents must survive;
- unmapping (``cuGraphicsUnmapResources``) uploads the host copy into the GL buffer (``glBufferSubData``), unless
  it was registered ``READ_ONLY``. The CPU device is synchronous, so the frame has written it by then: GL draws
  exactly what the frame wrote, after one host upload a frame (not zero-copy, as on a GPU).

The GL calls go through the GL context current on the calling thread (EGL's or GLX's, whichever is current; its
entry points are found with ``eglGetProcAddress`` / ``glXGetProcAddressARB``), as CUDA requires of these calls
too. Without one, the call raises ``CUDA_ERROR_INVALID_GRAPHICS_CONTEXT`` naming the fix; every GL call is
checked with ``glGetError`` (errors left pending by earlier GL calls are cleared first, so they are not taken for
rxcuda's). The buffer is bound to ``GL_COPY_WRITE_BUFFER`` for the calls, and that binding restored after: GL's
other bindings (vertex arrays, ``GL_ARRAY_BUFFER``) are left alone. It needs OpenGL 3.2 (``glGetBufferParameteri64v``).

GL textures (``cuGraphicsGLRegisterImage``, ``engine.gl_texture``) are refused on the CPU device, naming
``engine.gl_buffer``.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
from cuda.bindings import driver as _real

from ..model._errors import CudaError

_R = _real.CUresult
_READ_ONLY = int(_real.CUgraphicsRegisterFlags.CU_GRAPHICS_REGISTER_FLAGS_READ_ONLY)
_WRITE_DISCARD = int(_real.CUgraphicsRegisterFlags.CU_GRAPHICS_REGISTER_FLAGS_WRITE_DISCARD)
GL_COPY_WRITE_BUFFER = 0x8F37
GL_COPY_WRITE_BUFFER_BINDING = 0x8F37  # (the same enum names the target and, for glGetIntegerv, its binding)
GL_BUFFER_SIZE = 0x8764
GL_ERRORS = {0x0500: "GL_INVALID_ENUM", 0x0501: "GL_INVALID_VALUE", 0x0502: "GL_INVALID_OPERATION",
             0x0503: "GL_STACK_OVERFLOW", 0x0504: "GL_STACK_UNDERFLOW", 0x0505: "GL_OUT_OF_MEMORY",
             0x0506: "GL_INVALID_FRAMEBUFFER_OPERATION", 0x0507: "GL_CONTEXT_LOST"}
_ALIGN = 256

NO_CONTEXT = ("no OpenGL context is current on this thread: on the CPU device a GL buffer's contents are read and "
              "written through the current GL context. Make the context that owns the buffer current on this thread "
              "before engine.gl_buffer() and each shared.tick() (moderngl: create the context on this thread, or "
              "`with ctx:` around the calls)")

_void = ctypes.c_void_p
_SIGNATURES = {  # name -> (result, arguments)
    "glGetError": (ctypes.c_uint, ()),
    "glIsBuffer": (ctypes.c_ubyte, (ctypes.c_uint,)),
    "glBindBuffer": (None, (ctypes.c_uint, ctypes.c_uint)),
    "glGetIntegerv": (None, (ctypes.c_uint, ctypes.POINTER(ctypes.c_int))),
    "glGetBufferParameteri64v": (None, (ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_int64))),
    "glBufferSubData": (None, (ctypes.c_uint, ctypes.c_ssize_t, ctypes.c_ssize_t, _void)),
    "glGetBufferSubData": (None, (ctypes.c_uint, ctypes.c_ssize_t, ctypes.c_ssize_t, _void)),
}


def _fail(call: str, name: str, text: str) -> CudaError:
    return CudaError(call, name, text, int(getattr(_R, name)))


def _open(name: str, fallback: str):
    try:
        return ctypes.CDLL(ctypes.util.find_library(name) or fallback)
    except OSError:
        return None


class GL:
    """The GL entry points of the context current on the calling thread (EGL first, then GLX); loaded once."""

    _loaded: GL | None = None

    def __init__(self) -> None:
        self._apis = []  # (current-context function, get-proc-address function)
        egl, glx = _open("EGL", "libEGL.so.1"), _open("GL", "libGL.so.1")
        for lib, current, proc in ((egl, "eglGetCurrentContext", "eglGetProcAddress"),
                                   (glx, "glXGetCurrentContext", "glXGetProcAddressARB")):
            if lib is not None and hasattr(lib, current) and hasattr(lib, proc):
                cur, get = getattr(lib, current), getattr(lib, proc)
                cur.restype, cur.argtypes = _void, []
                get.restype, get.argtypes = _void, [ctypes.c_char_p]
                self._apis.append((cur, get))
        self._funcs: dict[tuple[int, str], object] = {}

    @classmethod
    def load(cls) -> GL:
        if cls._loaded is None:
            cls._loaded = GL()
        return cls._loaded

    def current(self, call: str) -> int:
        """Which of the loaded APIs has a context current on this thread (its index); raises naming the fix."""
        for i, (cur, _) in enumerate(self._apis):
            if cur():
                return i
        found = "" if self._apis else " (neither libEGL.so.1 nor libGL.so.1 could be loaded)"
        raise _fail(call, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", NO_CONTEXT + found)

    def fn(self, api: int, name: str, call: str = "cuGraphicsGLRegisterBuffer"):
        """The entry point ``name`` of the loaded API ``api`` (an index, from :meth:`current`)."""
        f = self._funcs.get((api, name))
        if f is None:
            address = self._apis[api][1](name.encode())
            if not address:
                raise _fail(call, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT",
                            f"the current GL context has no {name} (the CPU device needs OpenGL 3.2)")
            result, args = _SIGNATURES[name]
            f = self._funcs[(api, name)] = ctypes.CFUNCTYPE(result, *args)(address)
        return f

    def buffer_call(self, call: str, glo: int, work, *, named: bool = False):
        """``work(gl)`` with buffer ``glo`` bound to GL_COPY_WRITE_BUFFER of the current context (the binding
        restored after), every GL error checked; ``gl(name)`` gives an entry point. Returns what ``work`` returns.
        ``named``: first check that ``glo`` names a buffer (at registration; later, binding a name that is no
        buffer is a GL error, reported as such)."""
        api = self.current(call)

        def gl(name: str):
            return self.fn(api, name, call)

        get_error = gl("glGetError")
        for _ in range(16):  # left by GL calls before this one: not ours to report
            if not get_error():
                break
        if named and not gl("glIsBuffer")(glo):
            raise _fail(call, "CUDA_ERROR_INVALID_VALUE", f"{glo} names no buffer object of the current GL context")
        before = ctypes.c_int(0)
        gl("glGetIntegerv")(GL_COPY_WRITE_BUFFER_BINDING, ctypes.byref(before))
        gl("glBindBuffer")(GL_COPY_WRITE_BUFFER, glo)
        try:
            out = work(gl)
        finally:
            gl("glBindBuffer")(GL_COPY_WRITE_BUFFER, before.value)
            errors = []
            while (e := get_error()) and len(errors) < 8:
                errors.append(GL_ERRORS.get(e, hex(e)))
        if errors:
            raise _fail(call, "CUDA_ERROR_UNKNOWN", f"OpenGL reported {', '.join(errors)} for buffer {glo}")
        return out


def _size(gl) -> int:
    n = ctypes.c_int64(0)
    gl("glGetBufferParameteri64v")(GL_COPY_WRITE_BUFFER, GL_BUFFER_SIZE, ctypes.byref(n))
    return int(n.value)


class _Resource:
    """A registered GL buffer: its name, flags, whether mapped, and its host copy (address, bytes, the array)."""

    __slots__ = ("glo", "flags", "mapped", "ptr", "size", "memory")

    def __init__(self, glo: int, flags: int):
        self.glo, self.flags, self.mapped = glo, flags, False
        self.ptr, self.size, self.memory = 0, 0, None


class GLInteropMixin:
    """The OpenGL calls of the CPU driver (module docstring); kept apart for the size of ``_cpu``."""

    _gl_res: dict[int, _Resource]  # graphics resource -> its buffer (made by CpuDriver.__init__)

    def _gl_resource(self, call: str, resource) -> _Resource:
        r = self._gl_res.get(int(resource))
        if r is None:
            raise _fail(call, "CUDA_ERROR_INVALID_HANDLE", f"no registered graphics resource {int(resource):#x}")
        return r

    def _gl_host_copy(self, r: _Resource, size: int) -> None:
        """(Re)make the host copy at ``size`` bytes (a new address: the buffer was made anew at another size)."""
        if r.ptr:
            self.allocations.remove(r.ptr)
        raw = np.zeros(max(size, 1) + _ALIGN, dtype=np.uint8)
        r.ptr = raw.ctypes.data + (-raw.ctypes.data) % _ALIGN
        r.size, r.memory = size, raw
        self.allocations.add(r.ptr, max(size, 1))

    def cuGraphicsGLRegisterBuffer(self, glo, flags):
        glo, flags = int(glo), int(flags)
        size = GL.load().buffer_call("cuGraphicsGLRegisterBuffer", glo, _size, named=True)

        def register():
            h = self._new("graphics", _real.CUgraphicsResource)
            r = self._gl_res[int(h)] = _Resource(glo, flags)
            self._gl_host_copy(r, size)
            return (h,)

        return self._call("cuGraphicsGLRegisterBuffer", (glo, flags), register)

    def cuGraphicsGLRegisterImage(self, glo, target, flags):
        raise _fail("cuGraphicsGLRegisterImage", "CUDA_ERROR_NOT_SUPPORTED",
                    "the CPU device does not copy into GL textures (engine.gl_texture) yet; share a GL buffer "
                    "instead (engine.gl_buffer), or run on a GPU")

    @staticmethod
    def _each(count, resources) -> list:
        return list(resources)[:int(count)] if isinstance(resources, list | tuple) else [resources]

    def cuGraphicsMapResources(self, count, resources, stream):
        rs = [self._gl_resource("cuGraphicsMapResources", h) for h in self._each(count, resources)]
        result = self._call("cuGraphicsMapResources", (int(count), int(stream)))
        if result[0] != _R.CUDA_SUCCESS or any(r.mapped for r in rs):
            return result if result[0] != _R.CUDA_SUCCESS else (_R.CUDA_ERROR_ALREADY_MAPPED,)
        gl = GL.load()
        for r in rs:
            size = gl.buffer_call("cuGraphicsMapResources", r.glo, _size)
            if size != r.size:  # made anew at another size since: a new host copy, at a new address
                self._gl_host_copy(r, size)
            if not r.flags & _WRITE_DISCARD and size:  # its contents must survive: read them back
                gl.buffer_call("cuGraphicsMapResources", r.glo, lambda f, r=r: f("glGetBufferSubData")(
                    GL_COPY_WRITE_BUFFER, 0, r.size, r.ptr))
            r.mapped = True
        return result

    def cuGraphicsUnmapResources(self, count, resources, stream):
        rs = [self._gl_resource("cuGraphicsUnmapResources", h) for h in self._each(count, resources)]
        result = self._call("cuGraphicsUnmapResources", (int(count), int(stream)))
        if result[0] != _R.CUDA_SUCCESS or not all(r.mapped for r in rs):
            return result if result[0] != _R.CUDA_SUCCESS else (_R.CUDA_ERROR_NOT_MAPPED,)
        for r in rs:  # the CPU device is synchronous: the work queued on ``stream`` before this has run
            if not r.flags & _READ_ONLY and r.size:
                GL.load().buffer_call("cuGraphicsUnmapResources", r.glo, lambda gl, r=r: gl("glBufferSubData")(
                    GL_COPY_WRITE_BUFFER, 0, r.size, r.ptr))
            r.mapped = False
        return result

    def cuGraphicsResourceGetMappedPointer(self, resource):
        r = self._gl_resource("cuGraphicsResourceGetMappedPointer", resource)
        if not r.mapped:
            self._call("cuGraphicsResourceGetMappedPointer", (int(resource),))
            return (_R.CUDA_ERROR_NOT_MAPPED, None, None)
        return self._call("cuGraphicsResourceGetMappedPointer", (int(resource),), (_real.CUdeviceptr(r.ptr), r.size))

    def cuGraphicsUnregisterResource(self, resource):
        r = self._gl_res.pop(int(resource), None)
        if r is None:
            self._call("cuGraphicsUnregisterResource", (int(resource),))
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        self.allocations.remove(r.ptr)
        self._drop("graphics", resource)
        return self._call("cuGraphicsUnregisterResource", (int(resource),))

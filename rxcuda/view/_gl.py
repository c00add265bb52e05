"""Frames drawn by OpenGL: a port's memory shared with a GL buffer, or a 2-D port copied into a GL texture on
the GPU, mapped and unmapped in the engine's stream order every frame (the ``gl`` extra brings moderngl).

``engine.gl_buffer(port, glo)`` (a :class:`GLBuffer`) makes the GL buffer object named ``glo`` *be* the
port's memory: the port is bound to the buffer's device address (``engine.bind``), so the frame's kernels
write the vertices GL draws, with no copy at all. Before each frame the buffer is mapped for CUDA on the
engine's stream (GL's earlier drawing from it comes first), after it unmapped (the frame's writes come before
GL's next draw). The port must be one ``engine.bind`` takes: not connected (a renderer's own output port).

``engine.gl_texture(port, glo)`` (a :class:`GLTexture`) copies a 2-D port into a GL texture after each frame:
one device-to-device copy (``cuMemcpy2DAsync`` into the texture's CUDA array), because a kernel cannot write
a texture's array through a pointer. Nothing goes through the host either way.

On the CPU device (no GPU) a GL buffer works the same from here, but its memory cannot be shared: the port is bound
to a host copy of the buffer, uploaded into it after each frame (one ``glBufferSubData`` through the GL context
current on the render thread; docs/opengl.md says what it costs). GL textures are refused there.

The render loop is the frame clock: the thread that owns the GL context ticks the engine through the shared
objects (``shared.tick()``, or ``gl_frame(engine, a, b)`` for several), not ``engine.run()`` on a thread of its
own: mapping needs the GL context's thread.

>>> import moderngl                                                              # doctest: +SKIP
>>> ctx = moderngl.create_context(standalone=True, backend="egl")                # doctest: +SKIP
>>> vbo = ctx.buffer(reserve=n * 16)                                             # doctest: +SKIP
>>> shared = engine.gl_buffer(render["vertices"], vbo.glo)                       # doctest: +SKIP
>>> while drawing:                                                               # doctest: +SKIP
...     shared.tick()                        # map, one frame, unmap: all on the engine's stream
...     vao.render(moderngl.POINTS)          # GL draws what the frame wrote
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from ..cuda import _gl
from ..engine._engine import Engine
from ..model import _dtypes
from ..model._errors import EngineClosedError


def _port_name(port) -> str:
    return f"{port.block.name}.{port.name}"


class _Shared:
    """What a GL buffer and a GL texture have in common: registration, the frame protocol, closing."""

    what = "GL object"

    def __init__(self, engine: Engine, port, glo: int, register):
        if not isinstance(engine, Engine):
            raise TypeError(f"{type(self).__name__} shares a port of an rxcuda.Engine (got {type(engine).__name__})")
        if engine.closed:
            raise EngineClosedError(f"{type(self).__name__}: the engine is closed")
        if engine.running:
            raise RuntimeError(f"{type(self).__name__}: engine.run() drives the frames on its own thread, but GL "
                               "objects are mapped on the GL context's thread; dispose run() and tick from the "
                               "render loop (shared.tick())")
        if not isinstance(glo, int | np.integer) or isinstance(glo, bool) or glo <= 0:
            raise TypeError(f"{type(self).__name__} takes the GL object's name, a positive int such as moderngl's "
                            f"buffer.glo or texture.glo (got {glo!r})")
        self.engine, self.port, self.glo = engine, port, int(glo)
        self.shape = engine.shape(port)  # raises for a port of another engine, naming it
        self._api = engine.device.api
        engine.device.make_current()
        self._resource = register(self._api, self.glo)
        self._mapped = False
        self.closed = False

    @property
    def _stream(self) -> int:
        return int(self.engine.stream)

    def _check(self) -> None:
        if self.closed:
            raise RuntimeError(f"the {self.what} shared with {_port_name(self.port)} is closed")
        if self.engine.closed:
            raise EngineClosedError(f"the engine of {_port_name(self.port)} is closed")

    # subclasses define before_frame() (before the engine's tick) and after_frame() (after it)
    def __enter__(self):
        self._check()
        self.engine.device.make_current()  # the render thread may not have touched the engine's context yet
        self.before_frame()
        return self

    def __exit__(self, *exc) -> None:
        self.after_frame()

    def tick(self, sync: bool = False):
        """One frame with the GL object in the engine's stream order; returns the Frame. ``sync=False`` (the
        default): the host does not wait; GL's next use of the object waits for the frame on the GPU."""
        return gl_frame(self.engine, self, sync=sync)

    def close(self) -> None:
        """Unregister the GL object (idempotent); a GL buffer's port gets an engine-owned buffer again."""
        if self.closed:
            return
        self.closed = True
        if self.engine.closed:  # the context is gone, and the registration with it
            return
        self.engine.device.make_current()
        if self._mapped:
            _gl.unmap_resources(self._api, self._resource, self._stream)
            self._mapped = False
        _gl.unregister(self._api, self._resource)

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("mapped" if self._mapped else "unmapped")
        return f"<{type(self).__name__} {_port_name(self.port)} <-> GL object {self.glo}, {state}>"


class GLBuffer(_Shared):
    """A port whose memory is a GL buffer object: the frame writes what GL draws, no copy (on the CPU device, one
    host upload a frame; module docstring).

    ``engine.gl_buffer(port, glo)`` makes one. The buffer must hold at least the port's bytes (vector ports
    such as float4 are 16 bytes an element: ``ctx.buffer(reserve=n * 16)``).
    """

    what = "GL buffer"

    def __init__(self, engine: Engine, port, glo: int):
        super().__init__(engine, port, glo, _gl.register_buffer)
        dtype = port.spec.dtype
        if dtype is None:
            self.close()
            raise TypeError(f"{_port_name(port)} has no element type (void*); share a typed port with GL")
        layout = _dtypes.vector_layout(dtype)
        scalar, lanes = (layout[0], (layout[1],)) if layout else (dtype, ())
        self._typestr = np.dtype(_dtypes.to_numpy(scalar)).str
        self._lanes = lanes
        self.nbytes = math.prod(self.shape) * _dtypes.itemsize(dtype)
        self.pointer: int | None = None  # the device address the port is bound to

    def before_frame(self) -> None:
        """Map the buffer for CUDA on the engine's stream; the first time (or if GL moved it) bind the port to
        its address."""
        self._check()
        api = self._api
        _gl.map_resources(api, self._resource, self._stream)
        self._mapped = True
        ptr, size = _gl.mapped_pointer(api, self._resource)
        if ptr != self.pointer:
            if size < self.nbytes:
                self.after_frame()
                raise ValueError(f"GL buffer {self.glo} holds {size} bytes, but {_port_name(self.port)} "
                                 f"({'x'.join(map(str, self.shape))} {self.port.spec.dtype}) needs {self.nbytes}; "
                                 f"make it larger (moderngl: ctx.buffer(reserve={self.nbytes}))")
            self.engine.bind(self.port, _Mapped(ptr, self.shape + self._lanes, self._typestr))
            self.pointer = ptr

    def after_frame(self) -> None:
        """Give the buffer back to GL after the frame's work on the engine's stream."""
        if self._mapped:
            _gl.unmap_resources(self._api, self._resource, self._stream)
            self._mapped = False

    def close(self) -> None:
        bound = getattr(self, "pointer", None) is not None and not self.closed
        super().close()
        if bound and not self.engine.closed:
            self.engine.unbind(self.port)  # the address dies with the registration
            self.pointer = None


class GLTexture(_Shared):
    """A 2-D port copied into a GL texture after every frame, on the GPU (module docstring).

    The texture must match the port: as many rows and columns, and as many bytes a texel as the port has an
    element (f32: a one-channel float texture, ``ctx.texture((w, h), 1, dtype="f4")``; float4:
    ``ctx.texture((w, h), 4, dtype="f4")``; u8: ``ctx.texture((w, h), 1)``). ``engine.gl_texture`` makes one.
    """

    what = "GL texture"

    def __init__(self, engine: Engine, port, glo: int, target: int = _gl.GL_TEXTURE_2D):
        super().__init__(engine, port, glo, lambda api, glo: _gl.register_image(api, glo, target))
        if len(self.shape) != 2 or port.spec.dtype is None:
            self.close()
            raise ValueError(f"{_port_name(port)} is {'x'.join(map(str, self.shape)) or 'a scalar'}"
                             f"{'' if port.spec.dtype else ' without an element type'}: a GL texture takes a "
                             "typed 2-D port (resize it: engine.resize(port, (height, width)))")
        self.texel = _dtypes.itemsize(port.spec.dtype)
        engine.keep(port)  # its value after the frame is what is copied: memory reuse must not share it
        self._checked = None

    def before_frame(self) -> None:
        self._check()

    def after_frame(self) -> None:
        """Map the texture, copy the frame's port into its array, unmap: all on the engine's stream."""
        api, stream = self._api, self._stream
        _gl.map_resources(api, self._resource, stream)
        self._mapped = True
        try:
            array = _gl.mapped_array(api, self._resource)
            self.shape = self.engine.shape(self.port)  # as the frame ran it (a resize reaches outputs a frame later)
            if len(self.shape) != 2:
                raise ValueError(f"{_port_name(self.port)} is now {'x'.join(map(str, self.shape))}; a GL texture takes "
                                 "a 2-D port")
            h, w = self.shape
            if self._checked != (int(array), h, w):
                got = _gl.array_shape(api, array)
                if got != (h, w, self.texel):
                    raise ValueError(f"GL texture {self.glo} is {got[1]}x{got[0]} with {got[2]} bytes a texel, but "
                                     f"{_port_name(self.port)} is {h} rows of {w} {self.port.spec.dtype} "
                                     f"({self.texel} bytes each); make the texture ({w}, {h}) with that texel")
                self._checked = (int(array), h, w)
            src = self.engine.array(self.port).data.ptr
            _gl.copy_to_array(api, array, src, w * self.texel, h, stream)
        finally:
            _gl.unmap_resources(api, self._resource, stream)
            self._mapped = False


class _Mapped:
    """A mapped GL buffer as a device array (``__cuda_array_interface__``) for ``engine.bind``."""

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}


def gl_frame(engine: Engine, *shared: _Shared, sync: bool = False):
    """One frame with several GL objects mapped around it (each in the engine's stream order); returns the
    Frame. ``gl_frame(engine, vertices, image)`` is what ``shared.tick()`` does for one."""
    with contextlib.ExitStack() as stack:
        for s in shared:
            if s.engine is not engine:
                raise ValueError(f"the {s.what} of {_port_name(s.port)} belongs to another engine")
            stack.enter_context(s)
        return engine.tick(sync=sync)


__all__ = ["GLBuffer", "GLTexture", "gl_frame"]

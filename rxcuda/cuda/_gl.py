"""CUDA-OpenGL interop as named verbs: register a GL buffer or texture, map it on a stream, get its device
pointer or array, copy into an array, unmap, unregister. Every call goes through the layer's ``api`` (the
driver, or the null driver), so the logic above it runs without a GPU. The CPU device's driver answers the buffer
calls for real (``_cpugl``): a mapped buffer is a host copy, uploaded into the GL buffer when unmapped.

Mapping and unmapping are stream-ordered: ``map_resources(api, res, stream)`` orders the GL work issued
before it ahead of the CUDA work queued on ``stream`` after it, and ``unmap_resources`` orders the CUDA work
queued on ``stream`` before it ahead of the GL work issued after it. The GL context the object belongs to
must be current on the calling thread when it is registered (and while it is mapped and unmapped).

>>> from rxcuda.cuda import NullDriver
>>> api = NullDriver()
>>> api.gl_objects[7] = 4096            # the null driver's stand-in for a GL buffer of 4096 bytes, name 7
>>> res = register_buffer(api, 7)
>>> map_resources(api, res, 0); mapped_pointer(api, res)[1]
4096
>>> unmap_resources(api, res, 0); unregister(api, res)
"""

from __future__ import annotations

from ._driver import check

GL_TEXTURE_2D = 0x0DE1  # the target of a 2-D texture (GL/gl.h)


def register_buffer(api, glo: int, *, write_discard: bool = True):
    """Register the GL buffer object named ``glo`` (moderngl: ``buffer.glo``) for CUDA; returns the resource.
    ``write_discard``: CUDA only writes it (the driver need not keep its old contents)."""
    flags = api.CUgraphicsRegisterFlags
    flag = flags.CU_GRAPHICS_REGISTER_FLAGS_WRITE_DISCARD if write_discard else flags.CU_GRAPHICS_REGISTER_FLAGS_NONE
    return check(api.cuGraphicsGLRegisterBuffer(int(glo), flag), "cuGraphicsGLRegisterBuffer")


def register_image(api, glo: int, target: int = GL_TEXTURE_2D, *, write_discard: bool = True):
    """Register the GL texture named ``glo`` (moderngl: ``texture.glo``) for CUDA; returns the resource."""
    flags = api.CUgraphicsRegisterFlags
    flag = flags.CU_GRAPHICS_REGISTER_FLAGS_WRITE_DISCARD if write_discard else flags.CU_GRAPHICS_REGISTER_FLAGS_NONE
    return check(api.cuGraphicsGLRegisterImage(int(glo), int(target), flag), "cuGraphicsGLRegisterImage")


def map_resources(api, resource, stream) -> None:
    """Map a registered resource for CUDA, ordered on ``stream`` after the GL work issued so far."""
    check(api.cuGraphicsMapResources(1, resource, stream), "cuGraphicsMapResources")


def unmap_resources(api, resource, stream) -> None:
    """Give a mapped resource back to GL, after the CUDA work queued on ``stream`` so far."""
    check(api.cuGraphicsUnmapResources(1, resource, stream), "cuGraphicsUnmapResources")


def mapped_pointer(api, resource) -> tuple[int, int]:
    """A mapped buffer's device pointer and size in bytes (valid while it stays mapped)."""
    ptr, size = check(api.cuGraphicsResourceGetMappedPointer(resource), "cuGraphicsResourceGetMappedPointer")
    return int(ptr), int(size)


def mapped_array(api, resource, index: int = 0, level: int = 0):
    """A mapped texture's CUDA array (its layer ``index``, mip ``level``)."""
    return check(api.cuGraphicsSubResourceGetMappedArray(resource, index, level), "cuGraphicsSubResourceGetMappedArray")


def array_shape(api, array) -> tuple[int, int, int]:
    """A CUDA array's (height, width, bytes per texel)."""
    desc = check(api.cuArrayGetDescriptor(array), "cuArrayGetDescriptor")
    fmt = api.CUarray_format
    sizes = {fmt.CU_AD_FORMAT_UNSIGNED_INT8: 1, fmt.CU_AD_FORMAT_SIGNED_INT8: 1, fmt.CU_AD_FORMAT_UNSIGNED_INT16: 2,
             fmt.CU_AD_FORMAT_SIGNED_INT16: 2, fmt.CU_AD_FORMAT_HALF: 2, fmt.CU_AD_FORMAT_UNSIGNED_INT32: 4,
             fmt.CU_AD_FORMAT_SIGNED_INT32: 4, fmt.CU_AD_FORMAT_FLOAT: 4}
    return max(int(desc.Height), 1), int(desc.Width), sizes.get(desc.Format, 0) * int(desc.NumChannels)


def copy_to_array(api, array, src: int, row_bytes: int, rows: int, stream) -> None:
    """Copy ``rows`` rows of ``row_bytes`` from device memory at ``src`` (rows packed) into a CUDA array, on
    ``stream``: a device-to-device copy."""
    p = api.CUDA_MEMCPY2D()
    p.srcMemoryType = api.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcDevice = int(src)
    p.srcPitch = int(row_bytes)
    p.dstMemoryType = api.CUmemorytype.CU_MEMORYTYPE_ARRAY
    p.dstArray = array
    p.WidthInBytes = int(row_bytes)
    p.Height = int(rows)
    check(api.cuMemcpy2DAsync(p, stream), "cuMemcpy2DAsync")


def unregister(api, resource) -> None:
    """Unregister a resource (it must not be mapped)."""
    check(api.cuGraphicsUnregisterResource(resource), "cuGraphicsUnregisterResource")


__all__ = ["GL_TEXTURE_2D", "array_shape", "copy_to_array", "map_resources", "mapped_array", "mapped_pointer",
           "register_buffer", "register_image", "unmap_resources", "unregister"]

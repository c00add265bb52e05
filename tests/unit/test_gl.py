"""OpenGL interop on the null driver: which driver calls a shared GL buffer or texture makes around a frame, in
which order and on which stream; the port bound to the buffer's address; and every error path. (tests/gpu
draws with moderngl through EGL and checks the pixels.)"""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda
from rxcuda import Block
from rxcuda.cuda import NullDriver, _gl
from rxcuda.cuda._memory import ExternalArray

N = 256
VBO, TEX = 11, 12


@pytest.fixture
def api():
    api = NullDriver()
    api.gl_objects[VBO] = N * 4
    api.gl_objects[TEX] = (16, 16, 4)  # 16 rows of 16 one-channel float texels
    return api


@pytest.fixture
def engine(api, monkeypatch):
    import rxcuda.engine._engine as engine_module

    # the null driver has no memory for cuda.core to inspect: a mapped buffer resolves to its pointer and size
    def resolve(arr, stream=None, api=None):
        cai = arr.__cuda_array_interface__
        return ExternalArray(cai["data"][0], "f32", int(np.prod(cai["shape"])), cai["shape"], arr)

    monkeypatch.setattr(engine_module, "resolve_device_array", resolve)
    with rxcuda.Engine(driver=api) as e:
        yield e


def pipeline(engine):
    mul = engine.add(Block.from_kernel("kernels/scalar_mul.ptx", size=N, name="mul"))
    engine.write(mul["x"], np.random.default_rng().normal(size=N).astype(np.float32))
    return mul


def test_the_verbs_register_map_and_unmap_through_the_api(api):
    res = _gl.register_buffer(api, VBO)
    _gl.map_resources(api, res, 5)
    ptr, size = _gl.mapped_pointer(api, res)
    assert size == N * 4 and ptr
    _gl.unmap_resources(api, res, 5)
    with pytest.raises(rxcuda.CudaError, match="cuGraphicsResourceGetMappedPointer.*NOT_MAPPED"):
        _gl.mapped_pointer(api, res)
    _gl.unregister(api, res)
    assert api.leaks() == {}
    with pytest.raises(rxcuda.CudaError, match="cuGraphicsGLRegisterBuffer.*INVALID_VALUE"):
        _gl.register_buffer(api, 99)  # no such GL buffer


def test_a_gl_buffer_is_the_ports_memory_mapped_around_each_frame(engine, api):
    mul = pipeline(engine)
    shared = engine.gl_buffer(mul["out"], VBO)
    assert api.count("cuGraphicsGLRegisterBuffer") == 1
    mark = len(api.calls)
    frame = shared.tick()
    calls = api.since(mark)
    assert calls.index("cuGraphicsMapResources") < calls.index("cuGraphLaunch") < calls.index(
        "cuGraphicsUnmapResources")
    stream = int(engine.stream)
    assert all(args[1] == stream for name, args in api.calls[mark:] if name.startswith("cuGraphicsMap")
               or name.startswith("cuGraphicsUnmap"))
    assert "structure" in frame.tiers  # the first frame binds the port to the buffer: a rebuild
    assert shared.pointer == 0x7E00_0000_0000 + VBO * 0x100_0000
    rebuilds = engine.rebuilds
    for _ in range(3):
        frame = shared.tick()
        assert frame.tiers == () and frame.launched  # the same address: nothing to update
    assert engine.rebuilds == rebuilds
    assert api.count("cuGraphicsMapResources") == api.count("cuGraphicsUnmapResources") == 4
    shared.close()
    assert api.count("cuGraphicsUnregisterResource") == 1
    assert engine.tick().tiers == ("structure",)  # the port has its own buffer again
    shared.close()  # idempotent
    assert api.count("cuGraphicsUnregisterResource") == 1


def test_a_gl_buffer_too_small_for_the_port_is_refused_and_unmapped(engine, api):
    mul = pipeline(engine)
    api.gl_objects[20] = N  # a quarter of what N floats need
    shared = engine.gl_buffer(mul["out"], 20)
    with pytest.raises(ValueError, match=rf"GL buffer 20 holds {N} bytes, but mul.out .* needs {4 * N}; .*reserve"):
        shared.tick()
    assert api.count("cuGraphicsMapResources") == api.count("cuGraphicsUnmapResources") == 1
    assert api.count("cuGraphLaunch") == 0


def test_a_gl_texture_gets_the_2d_port_copied_after_each_frame(engine, api):
    mul = pipeline(engine)
    engine.resize(mul["x"], (16, 16))
    engine.write(mul["x"], np.ones((16, 16), np.float32))
    engine.tick()  # the output takes the input's new shape at the next frame
    shared = engine.gl_texture(mul["out"], TEX)
    mark = len(api.calls)
    shared.tick()
    calls = api.since(mark)
    assert calls.index("cuGraphLaunch") < calls.index("cuGraphicsMapResources") < calls.index(
        "cuMemcpy2DAsync") < calls.index("cuGraphicsUnmapResources")
    copy = next(args for name, args in api.calls[mark:] if name == "cuMemcpy2DAsync")
    assert copy[0] == engine.array(mul["out"]).data.ptr and copy[2:] == (16 * 4, 16, int(engine.stream))
    shared.tick()
    assert api.count("cuArrayGetDescriptor") == 1  # checked once per texture array
    assert api.count("cuMemcpy2DAsync") == 2
    shared.close()


def test_a_gl_texture_of_another_size_is_refused(engine, api):
    mul = pipeline(engine)
    engine.resize(mul["x"], (8, 32))
    engine.write(mul["x"], np.ones((8, 32), np.float32))
    engine.tick()
    shared = engine.gl_texture(mul["out"], TEX)
    with pytest.raises(ValueError, match=r"GL texture 12 is 16x16 with 4 bytes a texel, but mul.out is 8 rows of 32"):
        shared.tick()
    assert api.count("cuGraphicsMapResources") == api.count("cuGraphicsUnmapResources") == 1


def test_a_gl_texture_needs_a_2d_port(engine):
    mul = pipeline(engine)
    with pytest.raises(ValueError, match=r"mul.out is 256: a GL texture takes a typed 2-D port.*engine.resize"):
        engine.gl_texture(mul["out"], TEX)


def test_sharing_errors(engine, api):
    mul = pipeline(engine)
    with pytest.raises(TypeError, match=r"GL object's name, a positive int.*buffer.glo.*got 'vbo'"):
        engine.gl_buffer(mul["out"], "vbo")
    with pytest.raises(TypeError, match=r"GLBuffer shares a port of an rxcuda.Engine \(got str\)"):
        rxcuda.view.GLBuffer("engine", mul["out"], VBO)
    with pytest.raises(rxcuda.CudaError, match="cuGraphicsGLRegisterBuffer"):
        engine.gl_buffer(mul["out"], 404)
    running = engine.run(1000)
    try:
        with pytest.raises(RuntimeError, match=r"engine.run\(\) drives the frames.*render loop"):
            engine.gl_buffer(mul["out"], VBO)
    finally:
        running.dispose()
    shared = engine.gl_buffer(mul["out"], VBO)
    shared.close()
    with pytest.raises(RuntimeError, match=r"the GL buffer shared with mul.out is closed"):
        shared.tick()
    other = rxcuda.Engine(driver=NullDriver())
    try:
        s2 = engine.gl_buffer(mul["out"], VBO)
        with pytest.raises(ValueError, match="belongs to another engine"):
            rxcuda.view.gl_frame(other, s2)
        s2.close()
    finally:
        other.close()


def test_closing_the_engine_first_leaves_nothing_to_unregister(api, engine):
    mul = pipeline(engine)
    shared = engine.gl_buffer(mul["out"], VBO)
    shared.tick()
    engine.close()
    shared.close()
    assert api.count("cuGraphicsUnregisterResource") == 0 and shared.closed
    assert "closed" in repr(shared)

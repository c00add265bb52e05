"""Seeing inside a running pipeline: pictures of the graph (DOT), above the engine.

``to_dot(x)`` draws an Engine, a PipelineDescription or a GraphPlan as DOT text in pure Python (no GPU, no
Graphviz); ``save_graph(x, "pipeline.svg")`` renders it through Graphviz (optional: ``pip install graphviz``
and the system ``dot``), or writes the text for ``.dot``; ``save_driver_graph(engine, path)`` writes the CUDA
driver's own picture of the running graph (cuGraphDebugDotPrint).

Notebooks (``_widgets``): ``widgets(engine, params=None, previews=())`` gives ipywidgets controls bound both
ways to the parameters, a live frame-time plot and previews of outputs (the ``notebook`` extra).

OpenGL (``_gl``): ``engine.gl_buffer(port, glo)`` makes a port's memory a GL buffer (zero-copy),
``engine.gl_texture(port, glo)`` copies a 2-D port into a GL texture on the GPU after every frame.

Traces (``_trace``): ``engine.trace(path, frames=n)`` records a Chrome/Perfetto trace-event JSON (host and
GPU time per frame, updates with their tiers, reloads, diagnostics, parameter values as counters);
``read_trace`` / ``summarize`` read one back; ``plot_frames(trace, "frames.png")`` draws its frame times
(matplotlib, optional). NVTX ranges for Nsight live in the CUDA layer (``rxcuda.cuda._nvtx``).

The engine's own methods ``engine.to_dot()``, ``engine.save_graph(path)``, ``engine.trace(path)``,
``engine.serve()`` (the live view in a browser, ``_serve``; needs aiohttp), ``engine._repr_html_()`` (how Jupyter
shows an engine, ``_notebook``), ``engine.gl_buffer(port, glo)``, ``engine.gl_texture(port, glo)``
(rxcuda.engine._views) and ``plan.to_dot()`` call this package's functions, which it provides when imported
(``import rxcuda`` imports it; rxcuda.model._provided): the engine never imports this package (docs/architecture.md,
"Layout": view sits above engine). ``engine.save_driver_graph(path)`` is the engine's own work (the CUDA layer
draws it); ``save_driver_graph(engine, path)`` here calls it.

>>> import rxcuda
>>> with rxcuda.Engine(driver=rxcuda.cuda.NullDriver()) as engine:
...     _ = engine.add(rxcuda.Block.from_kernel("vector_add", size=16))
...     engine.to_dot() == rxcuda.view.to_dot(engine)
True
"""

from ..model._provided import provide
from ._dot import GraphvizNotFoundError, save_driver_graph, save_graph, to_dot
from ._gl import GLBuffer, GLTexture, gl_frame
from ._notebook import engine_html
from ._plot import MatplotlibNotFoundError, plot_frames
from ._serve import LiveView, LiveViewError, serve
from ._trace import Trace, TraceData, TraceSummary, read_trace, summarize, trace
from ._widgets import Widgets, WidgetsNotFoundError, widgets

# the work of the methods the engine and the plan declare (rxcuda.engine._views.EngineViews, GraphPlan.to_dot)
provide(to_dot=to_dot, save_graph=save_graph, trace=trace, serve=serve, gl_buffer=GLBuffer, gl_texture=GLTexture,
        engine_html=engine_html)

__all__ = ["GraphvizNotFoundError", "save_driver_graph", "save_graph", "to_dot"]
__all__ += ["MatplotlibNotFoundError", "Trace", "TraceData", "TraceSummary", "plot_frames", "read_trace", "summarize",
            "trace"]
__all__ += ["LiveView", "LiveViewError", "serve"]
__all__ += ["Widgets", "WidgetsNotFoundError", "widgets"]
__all__ += ["GLBuffer", "GLTexture", "gl_frame"]

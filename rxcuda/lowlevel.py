"""The pipeline as data: descriptions you can build by hand, and the planner that turns one into a graph plan.

An engine describes what it holds with ``engine.describe()``; ``plan()`` turns that (or a description you
build yourself: generated pipelines, tools, tests) into the :class:`GraphPlan` the engine would build. All
of it is pure Python on frozen values, so it runs without a GPU.

>>> import rxcuda
>>> from rxcuda.lowlevel import BlockEntry, Connection, PipelineDescription, PortRef, plan, validate
>>> signature = rxcuda.KernelSignature("scale", (
...     rxcuda.KernelParam("x", "pointer", 8, "f32", "in"),
...     rxcuda.KernelParam("out", "pointer", 8, "f32", "out"),
...     rxcuda.KernelParam("k", "scalar", 4, "f32", default=2.0),
...     rxcuda.KernelParam("n", "scalar", 4, "i32", default="size"),
... ))
>>> code = rxcuda.KernelCode("scale", b"(the PTX image)", "ptx", signature)  # or rxcuda.load_kernel_file(path)
>>> first = rxcuda.Block.from_kernel(code, size=1024, name="first")
>>> second = rxcuda.Block.from_kernel(code, size=1024, name="second")
>>> desc = PipelineDescription(
...     blocks=(BlockEntry(first.id, first.description), BlockEntry(second.id, second.description)),
...     connections=(Connection(PortRef(first.id, "out"), PortRef(second.id, "x")),),
...     fed=frozenset({PortRef(first.id, "x")}),  # the user writes first.x
... )
>>> gp = plan(desc)
>>> [node.label for node in gp.nodes], gp.deps
(['first/scale', 'second/scale'], ((), (0,)))
>>> [buffer.label for buffer in gp.buffers]  # first.out and second.x share one buffer
['first.x', 'first.out', 'second.out']
>>> try:
...     validate(PipelineDescription(blocks=desc.blocks, connections=desc.connections))
... except rxcuda.ValidationError as e:
...     print(e.subject, "--", str(e).split(";")[0])
first -- required input first.x is neither connected nor bound

Descriptions: :class:`PipelineDescription` (blocks, connections, bindings, fed inputs) of
:class:`BlockEntry` (a block's id, :class:`BlockDescription`, scalar values and launches),
:class:`Connection` between two :class:`PortRef`, :class:`ExternalBinding`. A block description holds
:class:`KernelSpec` / ``CallSpec`` steps, :class:`PortSpec`, :class:`ScalarSpec` and :class:`InternalBuffer`,
each wired to kernel parameters by :class:`Pin`. An append port's counter is a port of its own,
``"<port>.count"`` (:class:`CountSpec`, from ``BlockDescription.port``): a connection from
``PortRef(block, "items.count")`` feeds an input the count on the device.

Composites as data (``rxcuda.Composite.describe()``, rebuilt by ``Composite.from_description``):
:class:`CompositeDescription` of :class:`MemberDescription` members, :class:`InnerConnection` between
:class:`MemberPort` ends, :class:`ExposedPort` and :class:`ExposedParameter` (of :class:`MemberParameter`).

Plans: :class:`GraphPlan` of :class:`KernelNodePlan`, :class:`CallNodePlan`, :class:`MemsetNodePlan` and
:class:`RegionNodePlan` (a conditional node; ``GraphPlan.parents`` says which nodes are in its bodies) nodes,
:class:`BufferPlan` buffers, and :class:`BufferArg` / :class:`ScalarArg` / :class:`HandleArg` arguments.
Regions as data: :class:`RegionSpec` (``PipelineDescription.regions``).

Delayed connections (``Connection(src, dst, delay=1)``, feedback across frames) give a plan a
:class:`CopyNodePlan` per delayed output, after every other node; ``GraphPlan.delays`` maps the buffer the
output writes to its previous-frame buffer.

Several devices (``PipelineDescription.placement``: block id -> device position): :func:`split` makes one
plan per device from the whole pipeline's plan (a :class:`DeviceSplit`): a connection between devices is a
:class:`PeerCopyNodePlan` in the reading device's plan, ordered by :class:`EventRecordNodePlan` /
:class:`EventWaitNodePlan` pairs (each :class:`Link` names one); :func:`check_placement` reports what a
placement cannot do.

Functions: :func:`plan`, :func:`validate` (raises one :class:`~rxcuda.ValidationError` listing every
error), :func:`check` (every :class:`Problem`, errors and warnings, raising nothing), :func:`order_blocks`
(the topological order the plan uses).
"""

from .model._composite import (
    CompositeDescription,
    ExposedParameter,
    ExposedPort,
    InnerConnection,
    MemberDescription,
    MemberParameter,
    MemberPort,
)
from .model._describe import (
    BlockDescription,
    BlockEntry,
    CallSpec,
    Connection,
    CountSpec,
    ExternalBinding,
    InternalBuffer,
    KernelCode,
    KernelParam,
    KernelSignature,
    KernelSpec,
    Launch,
    Pin,
    PipelineDescription,
    PortRef,
    PortSpec,
    ScalarSpec,
)
from .model._errors import Problem
from .model._graphplan import (
    BufferArg,
    BufferPlan,
    CallNodePlan,
    CopyNodePlan,
    EventRecordNodePlan,
    EventWaitNodePlan,
    GraphPlan,
    HandleArg,
    KernelNodePlan,
    MemsetNodePlan,
    NodePlan,
    PeerCopyNodePlan,
    RegionNodePlan,
    ScalarArg,
    StampLayout,
    StampNodePlan,
)
from .model._regions import RegionSpec
from .plan._placement import DeviceSplit, Link, check_placement, split
from .plan._plan import check, order_blocks, plan, validate

__all__ = [
    "BlockDescription",
    "BlockEntry",
    "BufferArg",
    "BufferPlan",
    "CallNodePlan",
    "CallSpec",
    "CompositeDescription",
    "Connection",
    "CopyNodePlan",
    "CountSpec",
    "DeviceSplit",
    "EventRecordNodePlan",
    "EventWaitNodePlan",
    "ExposedParameter",
    "ExposedPort",
    "ExternalBinding",
    "GraphPlan",
    "HandleArg",
    "InnerConnection",
    "InternalBuffer",
    "KernelCode",
    "KernelNodePlan",
    "KernelParam",
    "KernelSignature",
    "KernelSpec",
    "Launch",
    "Link",
    "MemberDescription",
    "MemberParameter",
    "MemberPort",
    "MemsetNodePlan",
    "NodePlan",
    "PeerCopyNodePlan",
    "Pin",
    "PipelineDescription",
    "PortRef",
    "PortSpec",
    "Problem",
    "RegionNodePlan",
    "RegionSpec",
    "ScalarArg",
    "ScalarSpec",
    "StampLayout",
    "StampNodePlan",
    "check",
    "check_placement",
    "order_blocks",
    "plan",
    "split",
    "validate",
]

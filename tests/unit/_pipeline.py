"""Helpers for building pipeline descriptions in unit tests, without a GPU or kernel files."""

from __future__ import annotations

from rxcuda import Block, BlockBuilder
from rxcuda.lowlevel import (
    BlockEntry,
    Connection,
    ExternalBinding,
    KernelCode,
    KernelParam,
    KernelSignature,
    PipelineDescription,
    PortRef,
)


def ptr(name: str, direction: str = "in", dtype: str | None = "f32") -> KernelParam:
    return KernelParam(name=name, kind="pointer", size=8, dtype=dtype, direction=direction, align=8)


def scalar(name: str, dtype: str | None = "i32", default=None, size: int = 4) -> KernelParam:
    return KernelParam(name=name, kind="scalar", size=size, dtype=dtype, default=default, align=size)


def kcode(entry: str, *params: KernelParam, image: bytes | None = None) -> KernelCode:
    image = image if image is not None else f"// {entry}".encode()
    return KernelCode(entry=entry, image=image, format="ptx", signature=KernelSignature(entry, tuple(params)))


ADD = kcode("add", ptr("a"), ptr("b"), ptr("out", "out"), scalar("n", default="size"))
MUL = kcode("mul", ptr("x"), ptr("out", "out"), scalar("scale", "f32", 1.0), scalar("n", default="size"))
IMUL = kcode("imul", ptr("x", dtype="i32"), ptr("out", "out", dtype="i32"), scalar("n", default="size"))
APPEND = kcode(
    "append",
    ptr("values"),
    ptr("out", "out"),
    ptr("count", "counter", "u32"),
    scalar("threshold", "f32", 0.0),
    scalar("capacity", "u32", "size"),
    scalar("n", default="size"),
)


def add(size: int = 64, name: str = "add") -> Block:
    return Block.from_kernel(ADD, size=size, name=name)


def mul(size: int = 64, name: str = "mul", **defaults) -> Block:
    return Block.from_kernel(MUL, size=size, name=name, **defaults)


def ref(port) -> PortRef:
    return PortRef(port.block.id, port.name)


def entry(block: Block) -> BlockEntry:
    return BlockEntry(block.id, block.description, block.values(), block.launches())


def pipeline(*blocks: Block, conns=(), fed=(), bindings=None) -> PipelineDescription:
    """A pipeline as Engine._snapshot builds it: blocks in order, connections, bindings, fed inputs."""
    return PipelineDescription(
        blocks=tuple(entry(b) for b in blocks),
        connections=tuple(Connection(ref(s), ref(d)) for s, d in conns),
        bindings={ref(p): ExternalBinding(dtype, count) for p, (dtype, count) in (bindings or {}).items()},
        fed=frozenset(ref(p) for p in fed),
    )


def all_inputs(*blocks: Block):
    """Every input port of the blocks, to mark as fed."""
    return [p for b in blocks for p in b.inputs]


def builder(name: str = "blk", size: int | None = 64) -> BlockBuilder:
    return BlockBuilder(name, size=size)

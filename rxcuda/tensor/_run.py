"""Running tensor programs: the process's result cache and counters, planning a program (the passes) and
keeping it runnable by structure, so the next evaluation of the same structure over new arrays is a lookup.

``_values(nodes)`` is the one way a program is evaluated (``Tensor.numpy()``, ``realize``, ``.cupy()``): every
output already in the result cache is returned as it is; else the runnable program kept under the outputs'
signature runs (unless the cache holds something it would compute); else the passes plan the program, it runs,
and the runnable program is kept.
"""

from __future__ import annotations

import builtins
import threading

import attrs

from ._cache import STATS as _STATS
from ._cache import ResultCache, Stats, keys, touch_outside
from ._graph import Node, topo
from ._passes import Passes, Plan, plan
from ._program import Program, evaluate, leaf_versions

_CACHE = ResultCache()


class _Traces(threading.local):
    """The traces of ``rxcuda.tensor.function`` under way on this thread (``_function``): evaluating a tensor
    inside one is refused. Per thread: a trace on one thread does not stop evaluations on another."""

    def __init__(self):
        self.stack: list = []


TRACING = _Traces()


def stats() -> Stats:
    """What evaluations did since :func:`reset_stats` (a copy, see :class:`Stats`): launches, nodes computed,
    cache hits, plans made, and on CUDA the kernels compiled (``compiles``) and upgraded.

    >>> import rxcuda.tensor as rt
    >>> rt.stats().compiles >= 0
    True
    """
    return attrs.evolve(_STATS)


def reset_stats() -> None:
    """Zero the counters :func:`stats` reports."""
    for f in attrs.fields(Stats):
        setattr(_STATS, f.name, 0)


def cache() -> ResultCache:
    """The process's result cache (``len(cache())`` results, ``cache().bytes``; ``cache().limit`` bytes)."""
    return _CACHE


def clear_cache() -> None:
    """Forget every cached result (the next evaluation computes everything again)."""
    _CACHE.clear()


def _program(nodes: list[Node], passes: Passes | None, use_cache: bool, roots=()) -> tuple[Plan, dict]:
    program = topo([*nodes, *roots])
    touch_outside(program)
    ks = keys(program)
    p = plan(nodes, roots=roots, passes=passes or Passes(), keys=ks,
             cached=(lambda n: ks[n] in _CACHE) if use_cache else (lambda n: False))
    return p, ks


_PROGRAMS: dict[tuple, Program] = {}
"""Runnable programs by structure (:func:`_signature`): a repeat skips the passes and the kernel lookups."""
_PROGRAM_LIMIT = 4096
_DEFAULT_PASSES = Passes()


def _leaves(nodes: list[Node]) -> tuple[tuple[Node, ...], tuple]:
    """The distinct leaves of ``nodes`` in first-use order, and where each output's leaves sit among them."""
    if len(nodes) == 1:
        return nodes[0].leaves, ()
    leaves: list[Node] = []
    at: dict[int, int] = {}
    maps = []
    for n in nodes:
        m = []
        for leaf in n.leaves:
            k = at.get(id(leaf))
            if k is None:
                k = at[id(leaf)] = len(leaves)
                leaves.append(leaf)
            m.append(k)
        maps.append(tuple(m))
    return tuple(leaves), tuple(maps)


def _signature(nodes: list[Node], leaves: tuple[Node, ...], maps: tuple, passes: Passes) -> tuple:
    """What a runnable program depends on: the outputs' structure, how their leaves line up, which leaves hold
    the same buffer (common-subexpression elimination merges those), and the passes."""
    serials: dict[int, int] = {}
    alias = tuple(serials.setdefault(leaf.attrs[0].serial, k) for k, leaf in enumerate(leaves))
    return (passes, tuple(n.sid for n in nodes), maps, alias)


def _values(nodes: list[Node], passes: Passes | None = None, use_cache: bool = True) -> list:
    if TRACING.stack:
        raise TRACING.stack[-1].refusal("reading a tensor's value (.numpy(), float(), .item(), print)")
    passes = passes or _DEFAULT_PASSES
    leaves, maps = _leaves(nodes)
    touch_outside(leaves)
    cache = _CACHE if use_cache else None
    versions = None
    if cache is not None:
        versions = leaf_versions(leaves)  # once: the outputs' keys, the cached-work check and the cache puts
        found = [cache.get((n.sid, tuple(versions[k] for k in m) if maps else tuple(versions)))
                 for n, m in zip(nodes, maps or [()] * len(nodes), strict=True)]
        if all(v is not None for v in found):  # every result is known: nothing runs
            _STATS.hits += len(nodes)
            return found
    sig = _signature(nodes, leaves, maps, passes)
    ready = _PROGRAMS.get(sig)
    if ready is not None and (cache is None or not ready.cached_any(versions, cache)):
        if ready.steps:
            _STATS.evaluations += 1
        return ready.run(leaves, cache, _STATS, versions)
    p, _ = _program(nodes, passes, use_cache)
    _STATS.plans += 1
    _STATS.hits += builtins.sum(o in p.known for o in p.outputs)
    if p.groups:
        _STATS.evaluations += 1
    runnable, values = evaluate(p, leaves, cache, _STATS)
    if p.known:  # this plan skips what the cache had: a repeat needs the plan that computes everything
        runnable = Program(_program(nodes, passes, False)[0], leaves)
    if len(_PROGRAMS) >= _PROGRAM_LIMIT:
        _PROGRAMS.clear()
    _PROGRAMS[sig] = runnable
    return values


def wait_compiled(timeout: float | None = None) -> int:
    """Block until the kernels NVRTC is building in the background are ready (or ``timeout`` seconds pass);
    returns how many are still being built.

    On CUDA a new kernel first runs as PTX written straight from its IR (a miss costs milliseconds); the tuned
    C++ build of the same kernel replaces it at a launch after NVRTC has made it. Call this before timing
    steady-state speed, or to have every later launch use the tuned kernels. Without CUDA it returns 0.
    """
    from ._cuda import FACTORY

    return FACTORY.wait(timeout)

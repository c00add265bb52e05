"""Exceptions. Each subclasses the builtin it refines and names the thing that failed and the fix."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import attrs

Severity = Literal["error", "warning"]


@attrs.frozen
class Problem:
    """One thing the planner found wrong with a pipeline (``"error"``: it cannot be planned) or probably
    wrong (``"warning"``: it plans, but likely not as meant). ``subject`` names the block or ``block.port``;
    ``block`` is the block's id where one block is concerned, so a caller can mark it."""

    severity: Severity
    subject: str
    message: str
    block: int | None = None


class RxcudaError(Exception):
    """Base class of every error rxcuda raises on purpose."""


class ValidationError(RxcudaError, ValueError):
    """A pipeline description is inconsistent (ports, dtypes, sizes, cycles, missing inputs).

    ``subject`` names the block, port or file concerned, so a caller can mark it. ``problems`` holds every
    :class:`Problem` the planner found at once, warnings included (``subject`` is the first error's).
    """

    def __init__(self, message: str, subject: str | None = None, problems: Iterable[Problem] = ()):
        super().__init__(message)
        self.subject = subject
        self.problems = tuple(problems)

    @classmethod
    def from_problems(cls, problems: Iterable[Problem]) -> ValidationError:
        """One error for all the ``problems`` (at least one an error): a single error's message as it is,
        several as ``"N problems: subjects"`` and then one line each."""
        problems = tuple(problems)
        errors = [p for p in problems if p.severity == "error"]
        if not errors:
            raise ValueError("from_problems needs at least one problem of severity 'error'")
        if len(errors) == 1:
            message = errors[0].message
        else:
            subjects = ", ".join(dict.fromkeys(p.subject for p in errors))
            message = "\n".join([f"{len(errors)} problems: {subjects}", *(f"- {p.message}" for p in errors)])
        return cls(message, subject=errors[0].subject, problems=problems)


class UnknownPortError(ValidationError, KeyError):
    """A port name that the block does not declare. Also a KeyError (a failed lookup by name), so both
    ``except rxcuda.ValidationError`` and ``except KeyError`` catch it."""

    __str__ = BaseException.__str__  # KeyError's would quote the message


class NotAPortError(ValidationError, TypeError):
    """Something other than a port (``block["out"]``) where a port is expected. Also a TypeError."""


class ForeignBlockError(ValidationError):
    """A port of a block that is not in this engine (never added, or removed); ``engine.add`` it first."""


class BoundsError(RxcudaError, ValueError):
    """A count parameter, or a launch, that would make a kernel index past a buffer: a value above the
    element count of a port it counts, or below 0. Nothing changed; the engine keeps running. ``block``,
    ``parameter``, ``port``, ``capacity`` and ``value`` say what was refused (``parameter`` is
    ``"threads"`` for a launch); ``engine.resize(port, shape)`` is how a buffer grows."""

    def __init__(self, message: str, *, block: str = "", parameter: str = "", port: str = "",
                 capacity: int | None = None, value=None):
        super().__init__(message)
        self.subject = f"{block}.{parameter}" if block else None
        self.block, self.parameter, self.port, self.capacity, self.value = block, parameter, port, capacity, value


class KernelFileError(RxcudaError, ValueError):
    """A kernel file or its JSON sidecar is missing, malformed, or disagrees with the kernel."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path


class CompileError(RxcudaError, RuntimeError):
    """Run-time compilation failed. ``diagnostics`` holds (file, line, column, message) records."""

    def __init__(self, message: str, diagnostics: tuple = (), log: str = ""):
        super().__init__(message)
        self.diagnostics = tuple(diagnostics)
        self.log = log


class CudaError(RxcudaError, RuntimeError):
    """A CUDA driver call failed. Carries the call, the error name and the driver's explanation."""

    def __init__(self, call: str, name: str, explanation: str, code: int | None = None):
        super().__init__(f"{call} failed with {name}: {explanation}")
        self.call = call
        self.name = name
        self.explanation = explanation
        self.code = code
        self.node: str | None = None  # the graph node whose work failed, where known (Engine(debug=True))


class DeviceLostError(CudaError):
    """The CUDA context of a GPU is lost: a kernel faulted (an illegal address, say). CUDA's errors of this
    kind are sticky -- every later call in this process fails -- so that GPU can be used again only from a
    new process. ``kernels`` names the kernels that ran in the faulting frame, where known; ``device``: the GPU's
    ordinal, or ``"cpu"`` for the CPU device.

    >>> str(DeviceLostError("cuGraphLaunch", "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal address", device="cpu"))[:48]
    "the CPU device's context is lost (CUDA_ERROR_ILL"
    """

    STICKY = ". CUDA errors of this kind are sticky: restart the process to use this GPU again"
    STICKY_CPU = STICKY.replace("this GPU", "the CPU device")  # (the CPU device keeps a GPU's rules: docs/cpu.md)

    def __init__(self, call: str, name: str, explanation: str, code: int | None = None, *, device: int | str = 0,
                 kernels: tuple[str, ...] = (), exact: bool = False):
        if exact:
            where = f"; the fault came from {kernels[0]}"
        elif kernels:
            where = (f"; the frame ran {', '.join(kernels)} (Engine(debug=True) runs them one by one and names "
                     "the one that faults)")
        else:
            where = ""
        if device == "cpu":
            lost, sticky = "the CPU device's context", self.STICKY_CPU
        else:
            lost, sticky = f"the CUDA context of GPU {device}", self.STICKY
        RxcudaError.__init__(self, f"{lost} is lost ({name} in {call}: {explanation}){sticky}" + where)
        self.call, self.name, self.explanation, self.code = call, name, explanation, code
        self.node = None
        self.device = device
        self.kernels = kernels


class NoDeviceError(RxcudaError, RuntimeError):
    """No usable CUDA device (no driver, no GPU, or the driver refused). ``reason`` says which."""

    def __init__(self, reason: str):
        super().__init__(f"no CUDA device: {reason}")
        self.reason = reason


class EngineClosedError(RxcudaError, RuntimeError):
    """The engine was closed; create a new one."""

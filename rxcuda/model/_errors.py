"""Exceptions. Each subclasses the builtin it refines and names the thing that failed and the fix."""

from __future__ import annotations


class RxcudaError(Exception):
    """Base class of every error rxcuda raises on purpose."""


class ValidationError(RxcudaError, ValueError):
    """A pipeline description is inconsistent (ports, dtypes, sizes, cycles, missing inputs).

    ``subject`` names the block, port or file concerned, so a caller can mark it.
    """

    def __init__(self, message: str, subject: str | None = None):
        super().__init__(message)
        self.subject = subject


class UnknownPortError(ValidationError, KeyError):
    """A port name that the block does not declare. Also a KeyError (a failed lookup by name), so both
    ``except rxcuda.ValidationError`` and ``except KeyError`` catch it."""

    __str__ = BaseException.__str__  # KeyError's would quote the message


class NotAPortError(ValidationError, TypeError):
    """Something other than a port (``block["out"]``) where a port is expected. Also a TypeError."""


class ForeignBlockError(ValidationError):
    """A port of a block that is not in this engine (never added, or removed); ``engine.add`` it first."""


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
    new process. ``kernels`` names the kernels that ran in the faulting frame, where known."""

    def __init__(self, call: str, name: str, explanation: str, code: int | None = None, *, device: int = 0,
                 kernels: tuple[str, ...] = (), exact: bool = False):
        if exact:
            where = f"; the fault came from {kernels[0]}"
        elif kernels:
            where = (f"; the frame ran {', '.join(kernels)} (Engine(debug=True) runs them one by one and names "
                     "the one that faults)")
        else:
            where = ""
        RxcudaError.__init__(
            self, f"the CUDA context of GPU {device} is lost ({name} in {call}: {explanation}). CUDA errors of "
            f"this kind are sticky: restart the process to use this GPU again" + where)
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

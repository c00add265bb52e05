"""The one part of the build pyproject.toml cannot declare: the compiled parameter path, rxcuda/cuda/_hotpath.c, as
an extension module (rxcuda.cuda._hotpath) built with the package, by `pip install .`, `pip wheel .` and the
editable `pip install -e .` (which builds it in place, beside the source). It is optional: where there is no C
compiler or no Python headers the build says so and goes on, and rxcuda takes its Python path (the same results,
~1 us more per parameter change; rxcuda/cuda/_native.py). Importing rxcuda compiles nothing.

The module carries the SHA-256 of the source it was built from (its ``SOURCE``): a module built in place is used only
while the _hotpath.c beside it is that source, so a checkout that pulled a new _hotpath.c without building again
takes the Python path and says why, instead of running old C against new Python."""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "rxcuda/cuda/_hotpath.c"
digest = hashlib.sha256((Path(__file__).resolve().parent / SOURCE).read_bytes()).hexdigest()

setup(
    ext_modules=[
        Extension(
            "rxcuda.cuda._hotpath",
            [SOURCE],
            # -fno-strict-aliasing: CPython's own flag for extensions (the casts between object structs)
            extra_compile_args=["-O2", "-fno-strict-aliasing"],
            define_macros=[("RXCUDA_HOTPATH_SOURCE", f'"{digest}"')],
            optional=True,
        )
    ]
)

"""The one part of the build pyproject.toml cannot declare: the compiled parameter path, rxcuda/cuda/_hotpath.c, as
an extension module (rxcuda.cuda._hotpath) built with the package, by `pip install .`, `pip wheel .` and the
editable `pip install -e .` (which builds it in place, beside the source). It is optional: where there is no C
compiler or no Python headers the build says so and goes on, and rxcuda takes its Python path (the same results,
~1 us more per parameter change; rxcuda/cuda/_native.py). Importing rxcuda compiles nothing."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rxcuda.cuda._hotpath",
            ["rxcuda/cuda/_hotpath.c"],
            # -fno-strict-aliasing: CPython's own flag for extensions (the casts between object structs)
            extra_compile_args=["-O2", "-fno-strict-aliasing"],
            optional=True,
        )
    ]
)

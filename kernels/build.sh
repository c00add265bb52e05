#!/usr/bin/env sh
# Rebuild kernels/*.ptx from kernels/*.cu. compute_75 PTX JITs on Turing and every newer GPU (CUDA 13's
# nvcc no longer targets Volta). The .json sidecars are written by hand and are not touched.
set -eu
cd "$(dirname "$0")"
for src in *.cu; do
    nvcc -ptx -arch=compute_75 "$src" -o "${src%.cu}.ptx"
    echo "built ${src%.cu}.ptx"
done

#!/usr/bin/env bash
# Rebuild rxcuda/cuda/_conditions.fatbin: the condition kernels of regions (If/While/For) and GPU-driven
# frames call cudaGraphSetConditional, which lives in the device runtime (libcudadevrt.a). A PTX load leaves
# it unresolved, so each architecture's cubin is linked here with nvlink and the cubins are packed into one
# fatbin that ships in the wheel: an installed rxcuda needs no toolkit for them. Needs nvcc/nvlink/fatbinary.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
src="$here/rxcuda/cuda/_conditions.cu"
out="$here/rxcuda/cuda/_conditions.fatbin"
cudadir="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
devrt="$(dirname "$(find "$cudadir" -name libcudadevrt.a | head -1)")"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
images=()
for sm in 75 80 86 89 90 100 120; do
  nvcc -arch=sm_$sm -rdc=true -cubin -o "$tmp/c$sm.cubin" "$src"
  nvlink -arch=sm_$sm "$tmp/c$sm.cubin" -L"$devrt" -lcudadevrt -o "$tmp/l$sm.cubin"
  images+=("--image3=kind=elf,sm=$sm,file=$tmp/l$sm.cubin")
done
fatbinary --64 --create="$out" "${images[@]}"
echo "wrote $out ($(stat -c %s "$out") bytes)"
# the same kernels as PTX, for the CPU device (rxcuda/cuda/_cpu.py): it runs PTX, and the fatbin carries cubins only
nvcc -arch=sm_75 -rdc=true -ptx -o "${out%.fatbin}.ptx" "$src"
echo "wrote ${out%.fatbin}.ptx"

#!/usr/bin/env bash
# The GPU batch (run on the device machine, not in CI): install the wheels the machine lacks, then
# tests/gpu, the demo and the benchmarks, logging everything under $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/card.txt"
# the compiled parameter path (setup.py's one extension module), built in place for this machine's Python: the tree
# runs from PYTHONPATH, not installed, and nothing compiles it at import. Where it does not build (no compiler, no
# Python headers, a setuptools older than pyproject.toml asks for) the Python path runs; card.txt says which
python3 setup.py -q build_ext --inplace > "$OUT/build-ext.log" 2>&1 || echo "build_ext failed: see build-ext.log"
python3 -c 'from rxcuda.cuda import _native; print("rxcuda parameter path:", _native.describe())' 2>&1 \
  | tee -a "$OUT/card.txt"
what=${1:-all}
if [[ $what == all || $what == tests ]]; then
  timeout 540 python3 -m pytest -q -rfE tests/gpu 2>&1 | tee "$OUT/gpu-tests.log" | tail -40
fi
if [[ $what == all || $what == demo ]]; then
  timeout 120 python3 -m rxcuda demo 2>&1 | tee "$OUT/demo.log" | tail -25
fi
if [[ $what == all || $what == examples ]]; then
  (cd "$(mktemp -d)" && for ex in quickstart "sensor_params 2" "hot_reload 2" particles solver peaks; do
     echo "== rxcuda.examples.$ex"; timeout 120 python3 -m "rxcuda.examples.${ex%% *}" $([[ $ex == *" "* ]] && echo "${ex#* }") 2>&1 | tail -12
   done) | tee "$OUT/examples.log"
fi
if [[ $what == all || $what == baseline ]] && [[ -d .old ]]; then
  # the commit before the redesign (git archive fa59cae into .old/, carried): bench/frame.py beside the new one
  (cd .old && PYTHONPATH=/tmp/site:$PWD timeout 200 python3 bench/frame.py 2>&1) | tee "$OUT/bench-frame-old.log" | tail -16
fi
if [[ $what == all || $what == bench ]]; then
  for b in ${BENCHES:-frame streams scale libraries compile generated regions profiling}; do
    [[ -f bench/$b.py ]] || continue
    timeout 200 python3 bench/$b.py 2>&1 | tee "$OUT/bench-$b.log" | tail -30
  done
fi

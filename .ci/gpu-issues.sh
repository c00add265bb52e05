#!/usr/bin/env bash
# The open issues' GPU batch (37, 39, 42), four calls of the device tool back to back (the machine keeps /tmp while
# warm). Each call carries git-ignored folders made on a machine with a package registry, from the project's root:
#   .whl, .ray1, .ray2  ../shared/tools/device-prep.sh --ray  (moderngl's wheels too: device-prep.sh moderngl glcontext)
#   .gllib              glvnd's libraries (the GPU machine has EGL's vendor library but no libGL):
#                       apt-get download libgl1 libglx0 libglvnd0 libegl1 libopengl0, then dpkg-deb -x each and copy
#                       usr/lib/x86_64-linux-gnu/lib*.so.*.* (the real files, no links) into .gllib
#   .wx                 the notebook and media extras' wheels without what the machine has (numpy, attrs, packaging,
#                       typing_extensions) and without debugpy (the 64 MiB carry): pip download --only-binary=:all:
#                       --python-version 3.12 --platform manylinux_2_28_x86_64 ... ipywidgets ipykernel nbclient
#                       nbformat av soundfile sounddevice graphviz nvtx
#   .base               the commit to compare with for issue 39's A/B: git archive <commit> | tar -x -C .base
# Then: run(command="bash .ci/gpu-issues.sh 1", carry=[...]) for 1..4 as below.
#  1: carry [".whl",".ray1",".gllib"]  tests/gpu (GL through .gllib's glvnd libs) + bench/faults.py + split
#  2: carry [".whl",".ray2",".gllib"]  Ray: distributed GPU tests, bench/distributed.py (mps/turns/deaths), MPS fault probe
#  3: carry [".whl",".wx",".gllib"]    the extras (notebook, media) and the GPU tests that need them
#  4: carry [".whl",".base"]          issue 39's A/B against .base, interleaved in one process (engine_ab), and bench/tensor.py
MODE=$1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ "$MODE" = 1 ] && mkdir -p /tmp/raypart && cp .ray1/* /tmp/raypart/
if [ "$MODE" = 2 ]; then cat /tmp/raypart/raypart.aa .ray2/raypart.ab > /tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/ray-*.whl .ray2/*.whl 2>&1 | grep -v "already exists" | tail -2; fi
[ "$MODE" = 3 ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .wx/*.whl 2>&1 | grep -v "already exists" | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v "already exists" | tail -2
[ -d .gllib ] && mkdir -p /tmp/gl && cp .gllib/* /tmp/gl/ && (cd /tmp/gl && ln -sf libOpenGL.so.0.0.0 libOpenGL.so.0 && ln -sf libOpenGL.so.0.0.0 libGL.so && ln -sf libEGL.so.1.1.0 libEGL.so.1 && ln -sf libEGL.so.1.1.0 libEGL.so && ln -sf libGLdispatch.so.0.0.0 libGLdispatch.so.0 && ln -sf libGLX.so.0.0.0 libGLX.so.0 && ln -sf libGL.so.1.7.0 libGL.so.1)
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/tmp/gl:${LD_LIBRARY_PATH:-}
EGLV=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json; [ -f $EGLV ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$EGLV
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git log -1 --format=%h 2>/dev/null
python3 setup.py -q build_ext --inplace > $OUT/build_ext.log 2>&1; python3 -c "import rxcuda.cuda._native as n; print(n.describe())"
python3 -c "import moderngl; print('EGL:', moderngl.create_context(standalone=True, backend='egl').info['GL_RENDERER'])" 2>&1 | tail -1
if [ "$MODE" = 1 ]; then
  RXCUDA_TEST_DEVICES=cuda timeout -s INT ${TESTS_S:-400} python3 -m pytest -q -p no:cacheprovider -rfE --durations=12 tests/gpu > $OUT/tests_main.log 2>&1
  echo "pytest rc=$?"; grep -aE "^(FAILED|ERROR)" $OUT/tests_main.log | head -40 | cut -c1-300; grep -a "isolated GL after" $OUT/tests_main.log | cut -c1-600; tail -1 $OUT/tests_main.log
  timeout 120 python3 bench/faults.py > $OUT/bench_faults.log 2>&1; echo "bench faults rc=$?"; tail -30 $OUT/bench_faults.log
  RXCUDA_CLOCK_SPIN_US=300 timeout 40 python3 bench/isolated_split.py 2>&1 | tail -3
fi
if [ "$MODE" = 2 ]; then
  python3 -c "import ray; print('ray', ray.__version__)"
  timeout -s INT ${TESTS_S:-300} python3 -m pytest -q -p no:cacheprovider -rfE ${RAYTESTS:-tests/gpu/test_distributed_faults_gpu.py tests/gpu/test_distributed_refusals_gpu.py tests/gpu/test_distributed_gpu.py tests/gpu/test_distributed_links_gpu.py tests/gpu/test_distributed_nodes_gpu.py} > $OUT/tests_ray.log 2>&1
  echo "pytest rc=$?"; grep -aE "^(FAILED|ERROR)" $OUT/tests_ray.log | head -30 | cut -c1-300; tail -1 $OUT/tests_ray.log
  python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
  timeout -s INT ${BENCH_S:-150} python3 bench/distributed.py ${DIST_ARGS:---only mps,deaths --frames 50} > $OUT/bench_distributed.log 2>&1; echo "bench distributed rc=$?"; grep -av "raylet\|WARNING\|INFO\|repeated\|Lease ID" $OUT/bench_distributed.log | tail -45
  python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
  timeout 120 python3 bench/mps_fault_probe.py > $OUT/mpsfault.log 2>&1; echo "mpsfault rc=$?"; cat $OUT/mpsfault.log | cut -c1-300 | tail -40
fi
if [ "$MODE" = 3 ]; then
  RXCUDA_TEST_DEVICES=cuda timeout -s INT ${TESTS_S:-300} python3 -m pytest -q -p no:cacheprovider -rfEs ${EXTRATESTS:-tests/gpu/test_docs_gpu.py tests/gpu/test_notebook_gpu.py tests/gpu/test_media_gpu.py} > $OUT/tests_extras.log 2>&1
  echo "pytest rc=$?"; grep -aE "^(FAILED|ERROR|SKIPPED)" $OUT/tests_extras.log | head -30 | cut -c1-300; tail -1 $OUT/tests_extras.log
fi
if [ "$MODE" = 4 ]; then  # carry [".whl",".base"]: issue 39's A/B against abab3c9 (.base: git archive of it), interleaved in one process
  timeout 280 python3 bench/engine_ab.py --base .base --devices 0 0 > $OUT/engine_ab.log 2>&1; echo "engine_ab rc=$?"; tail -30 $OUT/engine_ab.log
  timeout 200 python3 bench/tensor.py > $OUT/tensor.log 2>&1; echo "tensor rc=$?"; tail -25 $OUT/tensor.log
fi

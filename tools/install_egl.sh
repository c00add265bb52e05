#!/usr/bin/env sh
# Mesa's EGL with its software renderer (llvmpipe) for the tests that draw with OpenGL headless (the CPU device's
# engine.gl_buffer: tests/unit/test_gl_cpu.py, examples/particles_gl.py), installed by `make test` (its `egl` step,
# as root with apt-get) where it is missing: the GL loaders (libegl1, libgl1), Mesa's EGL vendor library
# (libegl-mesa0) and its DRI drivers (libgl1-mesa-dri), only what they depend on (--no-install-recommends), never
# an upgrade of a package already installed; when apt-get would upgrade one, nothing is installed and those tests
# skip, saying why. Prints what it installs; apt-get's output goes to LOG (tools/apt_install.sh).
#
# usage: tools/install_egl.sh [LOG]    (make test skips this step when RXCUDA_EGL is set, e.g. =skip)
set -u
. "$(dirname "$0")/apt_install.sh"
# only those not installed: naming an installed package to apt-get install would upgrade it to the candidate
missing=
for package in libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri; do
    dpkg-query -W -f='${Status}\n' "$package" 2>/dev/null | grep -q ' installed$' || missing="$missing $package"
done
if [ -z "$missing" ]; then
    echo "Mesa's EGL: nothing to install"
    exit 0
fi
# shellcheck disable=SC2086 # (the package names, one word each)
apt_install "Mesa's EGL" "Mesa's EGL (llvmpipe)" "the OpenGL tests" RXCUDA_EGL \
    "install libegl1, libegl-mesa0, libgl1 and libgl1-mesa-dri yourself" "${1:-/dev/null}" $missing
exit 0

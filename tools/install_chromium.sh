#!/usr/bin/env sh
# Debian's chromium for tests/browser, installed by `make test` (its `chromium` step, as root with apt-get), and
# nothing more: only the packages chromium depends on (--no-install-recommends), and never an upgrade of a
# package already installed. apt-get is asked first (-s, a simulation); when it would upgrade anything, nothing
# is installed and tests/browser skip, saying why. Prints what it installs; apt-get's output goes to LOG
# (tools/apt_install.sh does the asking and installing).
#
# usage: tools/install_chromium.sh [LOG]    (make test skips this step when RXCUDA_CHROMIUM is set, e.g. =skip)
set -u
. "$(dirname "$0")/apt_install.sh"
apt_install chromium "Debian's chromium" tests/browser RXCUDA_CHROMIUM \
    "install chromium yourself, or set RXCUDA_CHROMIUM to a Chromium executable" "${1:-/dev/null}" chromium
exit 0

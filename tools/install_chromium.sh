#!/usr/bin/env sh
# Debian's chromium for tests/browser, installed by `make test` (its `chromium` step, as root with apt-get), and
# nothing more: only the packages chromium depends on (--no-install-recommends), and never an upgrade of a
# package already installed. apt-get is asked first (-s, a simulation); when it would upgrade anything, nothing
# is installed and tests/browser skip, saying why. Prints what it installs; apt-get's output goes to LOG.
#
# usage: tools/install_chromium.sh [LOG]    (make test skips this step when RXCUDA_CHROMIUM is set, e.g. =skip)
set -u
log=${1:-/dev/null}

simulate() { LC_ALL=C apt-get -s install -y --no-install-recommends chromium 2>>"$log"; }

# the package lists may be missing (a fresh container) or stale: fetch them once when the simulation fails
if ! plan=$(simulate); then
    apt-get update -q >>"$log" 2>&1
    if ! plan=$(simulate); then
        echo "apt-get cannot install chromium (see $log): tests/browser will skip"
        exit 0
    fi
fi
printf '%s\n' "$plan" >>"$log"
# apt-get -s prints "Inst NAME (NEW ...)" for a new package and "Inst NAME [OLD] (NEW ...)" for an upgrade
upgrades=$(printf '%s\n' "$plan" | sed -n 's/^Inst \([^ ]*\) \[.*/\1/p' | tr '\n' ' ')
new=$(printf '%s\n' "$plan" | sed -n 's/^Inst \([^ ]*\) (.*/\1/p' | tr '\n' ' ')
if [ -n "$upgrades" ]; then
    echo "not installing chromium: apt-get would also upgrade installed packages (${upgrades% }); tests/browser" \
         "will skip (install chromium yourself, or set RXCUDA_CHROMIUM to a Chromium executable)"
    exit 0
fi
if [ -z "$new" ]; then
    echo "chromium: nothing to install"
    exit 0
fi
echo "installing Debian's chromium for tests/browser with apt-get (--no-install-recommends, no upgrades;" \
     "skip with RXCUDA_CHROMIUM=skip): $(printf '%s' "$new" | wc -w) packages: ${new% }"
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >>"$log" 2>&1; then
    echo "apt-get install chromium failed (see $log): tests/browser will skip"
fi
exit 0

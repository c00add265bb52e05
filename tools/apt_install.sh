#!/usr/bin/env sh
# What `make test` installs with apt-get as root for its tests (tools/install_chromium.sh, tools/install_egl.sh):
# only the packages named and what they depend on (--no-install-recommends), and never an upgrade of a package
# already installed. apt-get is asked first (-s, a simulation); when it would upgrade anything, nothing is installed
# and the tests that need it skip, saying why. Prints what it installs; apt-get's output goes to LOG.
#
# usage (sourced): apt_install NAME WHAT FOR SKIP HINT LOG PACKAGE...
#   NAME: short name in messages (chromium); WHAT: what it installs (Debian's chromium); FOR: the tests that need it
#   (tests/browser); SKIP: the variable that skips the step (RXCUDA_CHROMIUM); HINT: how else to get it

apt_install() {
    name=$1 what=$2 purpose=$3 skip=$4 hint=$5 log=$6
    shift 6
    # the package lists may be missing (a fresh container) or stale: fetch them once when the simulation fails
    if ! plan=$(LC_ALL=C apt-get -s install -y --no-install-recommends "$@" 2>>"$log"); then
        apt-get update -q >>"$log" 2>&1
        if ! plan=$(LC_ALL=C apt-get -s install -y --no-install-recommends "$@" 2>>"$log"); then
            echo "apt-get cannot install $name (see $log): $purpose will skip"
            return 0
        fi
    fi
    printf '%s\n' "$plan" >>"$log"
    # apt-get -s prints "Inst NAME (NEW ...)" for a new package and "Inst NAME [OLD] (NEW ...)" for an upgrade
    upgrades=$(printf '%s\n' "$plan" | sed -n 's/^Inst \([^ ]*\) \[.*/\1/p' | tr '\n' ' ')
    new=$(printf '%s\n' "$plan" | sed -n 's/^Inst \([^ ]*\) (.*/\1/p' | tr '\n' ' ')
    if [ -n "$upgrades" ]; then
        echo "not installing $name: apt-get would also upgrade installed packages (${upgrades% }); $purpose" \
             "will skip ($hint)"
        return 0
    fi
    if [ -z "$new" ]; then
        echo "$name: nothing to install"
        return 0
    fi
    echo "installing $what for $purpose with apt-get (--no-install-recommends, no upgrades;" \
         "skip with $skip=skip): $(printf '%s' "$new" | wc -w) packages: ${new% }"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >>"$log" 2>&1; then
        echo "apt-get install $name failed (see $log): $purpose will skip"
    fi
    return 0
}

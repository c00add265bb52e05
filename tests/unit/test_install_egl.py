"""tools/install_egl.sh (make test's `egl` step) against a stand-in apt-get and dpkg-query: it asks apt-get only for
the GL packages not installed yet (naming an installed one would upgrade it), installs them with what they depend
on, says which, and installs nothing when apt-get would upgrade an installed package."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "install_egl.sh"

FAKE_APT = """#!/bin/sh
echo "$*" >> "$FAKE/calls"
case "$1" in
  -s) cat "$FAKE/plan" ;;
esac
"""
# prints an installed status for the packages listed in $FAKE/installed, nothing (and fails) for the others
FAKE_DPKG_QUERY = """#!/bin/sh
package=$(eval echo \\${$#})
if grep -qx "$package" "$FAKE/installed"; then echo "install ok installed"; else exit 1; fi
"""
NEW = """NOTE: This is only a simulation!
Inst libegl-mesa0 (22.3.6-1+deb12u1 Debian:12.11/stable [amd64])
Inst libgl1-mesa-dri (22.3.6-1+deb12u1 Debian:12.11/stable [amd64])
Conf libegl-mesa0 (22.3.6-1+deb12u1 Debian:12.11/stable [amd64])
"""
UPGRADE = NEW + "Inst libgbm1 [22.3.6-1+deb12u1] (22.3.6-1+deb12u2 Debian:12.15/oldstable [amd64])\n"


@pytest.fixture
def apt(tmp_path):
    """A folder with stand-ins for apt-get and dpkg-query on PATH; returns (run, folder): run() runs the script,
    returning (stdout, the apt-get calls)."""
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    for name, text in (("apt-get", FAKE_APT), ("dpkg-query", FAKE_DPKG_QUERY)):
        (fake / "bin" / name).write_text(text)
        (fake / "bin" / name).chmod(0o755)
    (fake / "installed").write_text("libegl1\nlibgl1\n")

    def run() -> tuple[str, list[str]]:
        env = {**os.environ, "FAKE": str(fake), "PATH": f"{fake / 'bin'}{os.pathsep}{os.environ['PATH']}"}
        proc = subprocess.run(["sh", str(SCRIPT), str(tmp_path / "egl.log")], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        calls = (fake / "calls").read_text().splitlines() if (fake / "calls").exists() else []
        return proc.stdout, calls

    return run, fake


def test_installs_only_the_missing_packages_and_says_which(apt):
    run, fake = apt
    (fake / "plan").write_text(NEW)
    out, calls = run()
    assert out == ("installing Mesa's EGL (llvmpipe) for the OpenGL tests with apt-get (--no-install-recommends, no "
                   "upgrades; skip with RXCUDA_EGL=skip): 2 packages: libegl-mesa0 libgl1-mesa-dri\n")
    assert calls == ["-s install -y --no-install-recommends libegl-mesa0 libgl1-mesa-dri",
                     "install -y -q --no-install-recommends libegl-mesa0 libgl1-mesa-dri"]


def test_installs_nothing_when_apt_would_upgrade_an_installed_package(apt):
    run, fake = apt
    (fake / "plan").write_text(UPGRADE)
    out, calls = run()
    assert out.startswith("not installing Mesa's EGL: apt-get would also upgrade installed packages (libgbm1); the "
                          "OpenGL tests will skip (install libegl1, libegl-mesa0, libgl1 and libgl1-mesa-dri yourself)")
    assert calls == ["-s install -y --no-install-recommends libegl-mesa0 libgl1-mesa-dri"]  # no install, no upgrade


def test_asks_apt_nothing_when_everything_is_installed(apt):
    run, fake = apt
    (fake / "installed").write_text("libegl1\nlibegl-mesa0\nlibgl1\nlibgl1-mesa-dri\n")
    out, calls = run()
    assert out == "Mesa's EGL: nothing to install\n" and calls == []


def test_the_makefile_runs_the_script_where_mesas_egl_is_missing_unless_told_to_skip():
    text = (ROOT / "Makefile").read_text()
    assert "\ntest: $(STAMP) chromium egl\n" in text
    step = text.split("\negl: ", 1)[1].split("\n\n", 1)[0]
    assert '[ -z "$${RXCUDA_EGL:-}" ]' in step and "sh tools/install_egl.sh $(VENV)/egl.log" in step
    assert "egl_vendor.d/50_mesa.json" in step and "dri/swrast_dri.so" in step
    assert "apt-get install" not in step  # every apt-get call is the script's

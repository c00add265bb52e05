"""tools/install_chromium.sh (make test's `chromium` step) against a stand-in apt-get: it installs only what
chromium depends on, says which packages, and installs nothing when apt-get would upgrade an installed package."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "install_chromium.sh"

FAKE_APT = """#!/bin/sh
echo "$*" >> "$FAKE/calls"
case "$1" in
  update) touch "$FAKE/updated" ;;
  -s) if [ -f "$FAKE/no_lists" ] && [ ! -f "$FAKE/updated" ]; then
        echo "E: Unable to locate package chromium" >&2; exit 100
      fi
      cat "$FAKE/plan" ;;
esac
"""
NEW = """NOTE: This is only a simulation!
Inst libnss3 (2:3.87.1-1+deb12u1 Debian:12.11/stable [amd64])
Inst chromium-common (138.0.7204.183-1~deb12u1 Debian-Security:12/stable-security [amd64])
Inst chromium (138.0.7204.183-1~deb12u1 Debian-Security:12/stable-security [amd64])
Conf libnss3 (2:3.87.1-1+deb12u1 Debian:12.11/stable [amd64])
"""
UPGRADE = NEW + "Inst libudev1 [252.36-1~deb12u1] (252.38-1~deb12u1 Debian-Security:12/stable-security [amd64])\n" \
                "Inst systemd [252.36-1~deb12u1] (252.38-1~deb12u1 Debian-Security:12/stable-security [amd64])\n"


@pytest.fixture
def apt(tmp_path):
    """A folder with a stand-in apt-get on PATH; returns (run, folder): run() runs the script, returning
    (stdout, the apt-get calls)."""
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "apt-get").write_text(FAKE_APT)
    (fake / "bin" / "apt-get").chmod(0o755)

    def run() -> tuple[str, list[str]]:
        env = {**os.environ, "FAKE": str(fake), "PATH": f"{fake / 'bin'}{os.pathsep}{os.environ['PATH']}"}
        proc = subprocess.run(["sh", str(SCRIPT), str(tmp_path / "chromium.log")], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        calls = (fake / "calls").read_text().splitlines() if (fake / "calls").exists() else []
        return proc.stdout, calls

    return run, fake


def test_installs_only_what_chromium_depends_on_and_says_what(apt):
    run, fake = apt
    (fake / "plan").write_text(NEW)
    out, calls = run()
    assert out == ("installing Debian's chromium for tests/browser with apt-get (--no-install-recommends, no "
                   "upgrades; skip with RXCUDA_CHROMIUM=skip): 3 packages: libnss3 chromium-common chromium\n")
    assert calls == ["-s install -y --no-install-recommends chromium",
                     "install -y -q --no-install-recommends chromium"]


def test_installs_nothing_when_apt_would_upgrade_an_installed_package(apt):
    run, fake = apt
    (fake / "plan").write_text(UPGRADE)
    out, calls = run()
    assert out.startswith("not installing chromium: apt-get would also upgrade installed packages (libudev1 "
                          "systemd); tests/browser will skip")
    assert calls == ["-s install -y --no-install-recommends chromium"]  # no install, no upgrade


def test_fetches_the_package_lists_once_when_they_are_missing(apt):
    run, fake = apt
    (fake / "plan").write_text(NEW)
    (fake / "no_lists").write_text("")
    out, calls = run()
    assert calls[:3] == ["-s install -y --no-install-recommends chromium", "update -q",
                         "-s install -y --no-install-recommends chromium"]
    assert calls[3:] == ["install -y -q --no-install-recommends chromium"] and "3 packages" in out


def test_a_chromium_apt_cannot_find_is_one_line_and_no_failure(apt, tmp_path):
    run, fake = apt
    (fake / "plan").write_text(NEW)
    (fake / "no_lists").write_text("")
    (fake / "bin" / "apt-get").write_text(FAKE_APT.replace('touch "$FAKE/updated"', "true"))
    out, calls = run()
    assert out == f"apt-get cannot install chromium (see {tmp_path / 'chromium.log'}): tests/browser will skip\n"
    assert "install -y -q --no-install-recommends chromium" not in calls


def test_the_makefile_runs_the_script_unless_told_to_skip():
    text = (ROOT / "Makefile").read_text()
    step = text.split("\nchromium: ", 1)[1].split("\n\n", 1)[0]
    assert '[ -z "$${RXCUDA_CHROMIUM:-}" ]' in step and "sh tools/install_chromium.sh $(VENV)/chromium.log" in step
    assert "apt-get install" not in step  # every apt-get call is the script's

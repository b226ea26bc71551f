"""Wheels written by hand, and a PEP 517 build backend that writes one: the tests of
scripts/_venv.sh (tests/test_scripts.py) install them with pip, offline, in seconds.

As a build backend (a project's pyproject.toml: ``build-backend = "_wheels"``,
``backend-path = ["."]``, this file copied beside it), it builds ``devrng`` 0.0: a
``devrng`` package with a ``devrng`` command, or fails when ``DEVRNG_FAKE_BUILD_FAILS`` is set.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from pathlib import Path


def write_wheel(folder: str | Path, name: str, version: str,
                files: Mapping[str, str] | None = None,
                commands: Mapping[str, str] | None = None) -> Path:
    """A pure-Python wheel of ``name`` at ``version`` in ``folder``, holding ``files``
    (path in the wheel -> text), with console scripts ``commands`` (name -> "module:function")."""
    stem = f"{name.replace('-', '_')}-{version}"
    content = dict(files or {})
    info = f"{stem}.dist-info"
    content[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    content[f"{info}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: devrng-tests\n"
                                "Root-Is-Purelib: true\nTag: py3-none-any\n")
    if commands:
        content[f"{info}/entry_points.txt"] = "[console_scripts]\n" + "".join(
            f"{command} = {target}\n" for command, target in commands.items())
    content[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*content, f"{info}/RECORD"])
    wheel = Path(folder) / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in content.items():
            archive.writestr(path, text)
    return wheel


def build_wheel(wheel_directory: str, config_settings: object = None,
                metadata_directory: object = None) -> str:
    """PEP 517: the fake devrng's wheel."""
    if os.environ.get("DEVRNG_FAKE_BUILD_FAILS"):
        raise RuntimeError("the fake devrng's build fails, as DEVRNG_FAKE_BUILD_FAILS asks")
    return write_wheel(wheel_directory, "devrng", "0.0",
                       {"devrng/__init__.py": "def main() -> None:\n    print('fake devrng')\n"},
                       {"devrng": "devrng:main"}).name


build_editable = build_wheel

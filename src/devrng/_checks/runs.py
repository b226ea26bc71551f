"""Launching a user's training script under the flight record, for the checks that compare runs.

``devrng check-resume`` and ``devrng check-determinism`` differ only in the runs they
launch: each run is the user's own command in a working directory of its own, with the
record forced on there (``DEVRNG_FLIGHT_RECORD``), one seed for all (``DEVRNG_SEED``,
unless set) and the step limits the check asks for. A run that fails ends the check
with the end of its output.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from devrng._base.commands import devrng_missing, devrng_missing_in_output
from devrng._checks.compare import read_record
from devrng._checks.record import FLIGHT_VARIABLE, MAX_STEPS_VARIABLE, OPS_VARIABLE, STOP_VARIABLE

__all__ = ["CANNOT", "DIFFERS", "EXACT", "CheckFailed", "Runs", "checked", "last_step", "no_steps",
           "out", "records"]

EXACT, DIFFERS, CANNOT = 0, 1, 2


class CheckFailed(Exception):
    """The check could not be made: the sentence says why."""


def out(line: str = "") -> None:
    print(line, flush=True)


def checked(name: str, command: Sequence[str], keep: str | None,
            check: Callable[[Runs], int]) -> int:
    """Run ``check`` over a fresh directory of runs of ``command``; its exit status, or
    ``CANNOT`` with the reason printed. The directory goes unless kept or the check failed."""
    if not command:
        out(f"devrng {name}: give the command that trains after '--', for example: "
            f"devrng {name} --steps 20 -- python train.py")
        return CANNOT
    # (Absolute: each run works in a directory of its own.)
    root = os.path.abspath(keep) if keep else tempfile.mkdtemp(prefix=f"devrng-{name}-")
    os.makedirs(root, exist_ok=True)
    try:
        runs = Runs(list(command), root)
        problem = devrng_missing(runs.command, runs.env)
        if problem is not None:  # (before any run: not after the first one fails)
            raise CheckFailed(problem)
        code = check(runs)
    except CheckFailed as err:
        out(f"devrng {name}: {err}")
        code = CANNOT
    if keep is None and code == EXACT:
        shutil.rmtree(root, ignore_errors=True)
    else:
        out(f"(the runs' directories, records and output are in {root})")
    return code


class Runs:
    """The runs of one check: the user's command, and where each run works."""

    def __init__(self, command: list[str], root: str) -> None:
        self.command = _absolute(command)
        self.root = root
        env = dict(os.environ)
        for name in (STOP_VARIABLE, MAX_STEPS_VARIABLE, OPS_VARIABLE):
            env.pop(name, None)
        env.setdefault("DEVRNG_SEED", str(secrets.randbits(32)))
        here = os.getcwd()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
        self.env = env

    def run(self, number: str, what: str, name: str, extra: dict[str, str]) -> str:
        """Run the command in ``root/name`` (made if missing) with ``extra`` in its
        environment; the directory. A run that fails raises ``CheckFailed``."""
        directory = os.path.join(self.root, name)
        os.makedirs(directory, exist_ok=True)
        log = os.path.join(directory, "output.log")
        run_env = {**self.env, **extra, FLIGHT_VARIABLE: os.path.join(directory, "flight-record")}
        out(f"run {number}: {what} ...")
        started = time.monotonic()
        with open(log, "ab") as fh:
            code = subprocess.call(self.command, cwd=directory, env=run_env, stdout=fh,
                                   stderr=subprocess.STDOUT)
        took = time.monotonic() - started
        if code != 0:
            with open(log, "rb") as fh:
                tail = fh.read()[-3000:].decode(errors="replace")
            missing = devrng_missing_in_output(tail)
            raise CheckFailed(f"run {number} ({what}) exited with status {code} after "
                              f"{took:.1f} s; the end of its output:\n{tail}"
                              + (f"\n{missing}" if missing else ""))
        out(f"run {number}: done in {took:.1f} s")
        return directory


def records(directory: str) -> dict[int, dict[str, Any]]:
    """The records a run kept, by rank (see ``devrng._checks.compare.read_record``)."""
    found = {}
    pattern = os.path.join(directory, "flight-record", "devrng-flight.rank*.jsonl")
    for path in sorted(glob.glob(pattern)):
        rank = int(os.path.basename(path)[len("devrng-flight.rank"):-len(".jsonl")])
        found[rank] = read_record(path)
    return found


def last_step(found: dict[int, dict[str, Any]]) -> int:
    """The last step any attempt of any rank recorded (0: none)."""
    return max((max(a["steps"], default=0) for r in found.values()
                for a in r["attempts"].values()), default=0)


def no_steps(what: str) -> CheckFailed:
    return CheckFailed(f"{what} recorded no step: the script must train with "
                       "devrng.TrainingRNG or a devrng trainer integration (Lightning, "
                       "accelerate, HF Trainer), and take optimizer steps.")


def _absolute(command: list[str]) -> list[str]:
    """The command with its arguments that name existing files made absolute: each run has
    a working directory of its own. Directories are left as they are: a relative one is
    where a run writes (its checkpoints), each in its own working directory."""
    found = []
    for arg in command:
        if not arg.startswith("-") and not os.path.isabs(arg) and os.path.isfile(arg):
            arg = os.path.abspath(arg)
        found.append(arg)
    return found

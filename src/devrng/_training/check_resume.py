"""``devrng check-resume``: run a training script uninterrupted, then stopped and resumed, and
compare their flight records step by step.

A user's CI runs their own script three times, each in a fresh working directory,
with the flight record on (``DEVRNG_FLIGHT_RECORD``) and one seed (``DEVRNG_SEED``,
unless set): once straight through (``DEVRNG_MAX_STEPS`` ends it after ``--steps``),
once stopped right after its first checkpoint at or after step ``--stop``
(``DEVRNG_STOP_AFTER``; the process ends as a killed job does), and once more in the
stopped run's directory, where the script finds its checkpoint and resumes. The
resumed steps must equal the uninterrupted run's, generator by generator and batch by
batch; the exit status is 0 only when they do.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from devrng._training.compare import PARTS, compared_text, count_parts, explain, read_record
from devrng._training.flight import FLIGHT_VARIABLE, MAX_STEPS_VARIABLE, STOP_VARIABLE

__all__ = ["check_resume"]

EXACT, DIFFERS, CANNOT = 0, 1, 2


def _out(line: str = "") -> None:
    print(line, flush=True)


class _Failed(Exception):
    """The check could not be made: the sentence says why."""


def check_resume(command: Sequence[str], *, steps: int | None = None, stop: int | None = None,
                 keep: str | None = None) -> int:
    """Run ``command`` three times and compare; the exit status (0 exact, 1 differs,
    2 could not check)."""
    if not command:
        _out("devrng check-resume: give the command that trains after '--', for example: "
             "devrng check-resume --steps 20 -- python train.py")
        return CANNOT
    if steps is not None and steps < 1:
        _out(f"devrng check-resume: --steps is {steps}; give 1 or more.")
        return CANNOT
    if stop is not None and (stop < 1 or (steps is not None and stop >= steps)):
        _out(f"devrng check-resume: --stop is {stop}; give a step from 1 to "
             f"{'--steps - 1' if steps is None else steps - 1}.")
        return CANNOT
    root = keep or tempfile.mkdtemp(prefix="devrng-check-resume-")
    os.makedirs(root, exist_ok=True)
    try:
        code = _check(list(command), steps, stop, root)
    except _Failed as err:
        _out(f"devrng check-resume: {err}")
        code = CANNOT
    if keep is None and code == EXACT:
        shutil.rmtree(root, ignore_errors=True)
    else:
        _out(f"(the runs' directories, records and output are in {root})")
    return code


def _check(command: list[str], steps: int | None, stop: int | None, root: str) -> int:
    command = _absolute(command)
    env = dict(os.environ)
    for name in (STOP_VARIABLE, MAX_STEPS_VARIABLE):
        env.pop(name, None)
    env.setdefault("DEVRNG_SEED", str(secrets.randbits(32)))
    here = os.getcwd()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    limit = {MAX_STEPS_VARIABLE: str(steps)} if steps is not None else {}

    straight = os.path.join(root, "uninterrupted")
    _run("1/3", "uninterrupted", command, env, straight, limit)
    straight_records = _records(straight)
    last = max((max(a["steps"], default=0) for r in straight_records.values()
                for a in r["attempts"].values()), default=0)
    if last == 0:
        raise _Failed("the uninterrupted run recorded no step: the script must train with "
                      "devrng.TrainingRNG or a devrng trainer integration (Lightning, "
                      "accelerate, HF Trainer), and take optimizer steps.")
    stop = stop if stop is not None else max(1, last // 2)
    if stop >= last:
        raise _Failed(f"the uninterrupted run took {last} steps, so it cannot be stopped after "
                      f"step {stop}; give a smaller --stop.")
    stopped = os.path.join(root, "resumed")
    _run("2/3", f"stopped after its first checkpoint at or after step {stop}", command, env,
         stopped, {**limit, STOP_VARIABLE: str(stop)})
    stopped_records = _records(stopped)
    ends = {rank: _stopped_at(record) for rank, record in stopped_records.items()}
    if not ends or None in ends.values():
        checkpoints = sorted({s for r in stopped_records.values() for a in r["attempts"].values()
                              for s in a["checkpoints"]})
        raise _Failed(f"the run saved no checkpoint at or after step {stop} (its checkpoints: "
                      f"{', '.join(map(str, checkpoints)) or 'none'}), so there is nothing to "
                      "resume from; give a --stop at or before a step it checkpoints at.")
    _run("3/3", "resumed from that checkpoint", command, env, stopped, limit)
    return _compare(straight_records, _records(stopped), ends)


def _absolute(command: list[str]) -> list[str]:
    """The command with its arguments that name existing files made absolute: each run has
    a working directory of its own. Directories are left as they are: a relative one is
    where a run writes (its checkpoints), each in its own working directory."""
    out = []
    for arg in command:
        if not arg.startswith("-") and not os.path.isabs(arg) and os.path.isfile(arg):
            arg = os.path.abspath(arg)
        out.append(arg)
    return out


def _run(number: str, what: str, command: list[str], env: dict[str, str], directory: str,
         extra: dict[str, str]) -> None:
    os.makedirs(directory, exist_ok=True)
    log = os.path.join(directory, "output.log")
    run_env = {**env, **extra, FLIGHT_VARIABLE: os.path.join(directory, "flight-record")}
    _out(f"run {number}: {what} ...")
    started = time.monotonic()
    with open(log, "ab") as out:
        code = subprocess.call(command, cwd=directory, env=run_env, stdout=out,
                               stderr=subprocess.STDOUT)
    took = time.monotonic() - started
    if code != 0:
        with open(log, "rb") as fh:
            tail = fh.read()[-3000:].decode(errors="replace")
        raise _Failed(f"run {number} ({what}) exited with status {code} after {took:.1f} s; "
                      f"the end of its output:\n{tail}")
    _out(f"run {number}: done in {took:.1f} s")


def _records(directory: str) -> dict[int, dict[str, Any]]:
    found = {}
    for path in sorted(glob.glob(os.path.join(directory, "flight-record", "devrng-flight.rank*.jsonl"))):
        rank = int(os.path.basename(path)[len("devrng-flight.rank"):-len(".jsonl")])
        found[rank] = read_record(path)
    return found


def _stopped_at(record: dict[str, Any]) -> tuple[str, int] | None:
    for attempt, entry in record["attempts"].items():
        if entry["end"] and entry["end"][0] == "stop":
            return attempt, entry["end"][1]
    return None


def _compare(straight: dict[int, dict[str, Any]], resumed: dict[int, dict[str, Any]],
             ends: dict[int, tuple[str, int] | None]) -> int:
    if set(straight) != set(resumed):
        raise _Failed(f"the runs had different ranks ({sorted(straight)} and {sorted(resumed)}).")
    exact = True
    for rank in sorted(straight):
        stopped_attempt, checkpoint = ends[rank]  # type: ignore[misc]
        (reference,) = straight[rank]["attempts"].values() or [None]
        attempts = resumed[rank]["attempts"]
        after = [a for a in attempts.values() if a["from"] == (stopped_attempt, checkpoint)]
        label = f"rank {rank}: " if len(straight) > 1 else ""
        if reference is None or not after:
            raise _Failed(f"{label}the resumed run did not resume from the checkpoint of step "
                          f"{checkpoint} (its flight record has no entry saying so): does the "
                          "script load its checkpoint when it finds one?")
        problem = _first_difference(reference, attempts[stopped_attempt], 1, checkpoint)
        if problem is not None:
            _out(f"{label}the run is not reproducible from its seed: two runs differ before any "
                 f"resume, at {problem}. Two runs of the script from one seed must agree before "
                 "a resume can: seed before the model is built (devrng.TrainingRNG or "
                 "devrng.manual_seed at the top of the script; the integrations' callbacks made "
                 "before the model), and turn on devrng.deterministic()")
            exact = False
            continue
        last = max(reference["steps"], default=checkpoint)
        if last <= checkpoint:  # nothing to compare: never "exact" on no step
            raise _Failed(f"{label}the uninterrupted run recorded no step after the checkpoint "
                          f"of step {checkpoint}, so the resume has nothing to be compared "
                          "with; give a larger --steps, or a --stop before its last checkpoint.")
        resumed_steps = after[-1]["steps"]
        problem = _first_difference(reference, after[-1], checkpoint + 1, last)
        if problem is not None:
            _out(f"{label}resume differs at {problem}")
            exact = False
            continue
        # Exact only when every step after the checkpoint was compared, in full.
        missing = [s for s in range(checkpoint + 1, last + 1) if s not in resumed_steps]
        if missing:
            done = last - checkpoint - len(missing)
            raise _Failed(f"{label}the resumed run recorded {_steps(done)} of the "
                          f"{last - checkpoint} after the checkpoint of step {checkpoint} "
                          f"that the uninterrupted run recorded (none from step {missing[0]}); "
                          "it was not compared in full: did it end early, or fail?")
        pairs = [(reference["steps"][s][0], resumed_steps[s][0])
                 for s in range(checkpoint + 1, last + 1)]
        counts = count_parts(pairs)
        # What the uninterrupted run recorded at every step, the resumed run must have too.
        needed = [name for key, name in PARTS if key in ("g", "w")
                  and all(ref.get(key) is not None for ref, _ in pairs)]
        lacking = [name for name in needed if counts.get(name, 0) < len(pairs)]
        if lacking:
            raise _Failed(f"{label}steps {checkpoint + 1} to {last} matched, but the "
                          f"{' and '.join(lacking)} were not recorded at every one of them by "
                          "both runs, so the resume was not compared in full.")
        _out(f"{label}resume exact for steps {checkpoint + 1} to {last} (checkpoint at step "
             f"{checkpoint}; compared: {compared_text(counts, len(pairs))})")
    return EXACT if exact else DIFFERS


def _steps(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


def _first_difference(reference: dict[str, Any], other: dict[str, Any], first: int,
                      last: int) -> str | None:
    for step in range(first, last + 1):
        theirs, ours = reference["steps"].get(step), other["steps"].get(step)
        if theirs is None or ours is None:
            continue  # (a step only one run recorded: told apart by the caller)
        problem = explain(theirs[0], theirs[1], ours[0], ours[1])
        if problem is not None:
            return problem
    return None

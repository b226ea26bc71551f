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

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from devrng._checks.record import MAX_STEPS_VARIABLE, STOP_VARIABLE
from devrng._checks.runs import (
    CANNOT,
    DIFFERS,
    EXACT,
    CheckFailed,
    Runs,
    checked,
    last_step,
    no_steps,
    out,
    records,
)
from devrng._checks.verdict import Verdict, judge

__all__ = ["check_resume"]


def check_resume(command: Sequence[str], *, steps: int | None = None, stop: int | None = None,
                 keep: str | None = None) -> int:
    """Run ``command`` three times and compare; the exit status (0 exact, 1 differs,
    2 could not check)."""
    if steps is not None and steps < 1:
        out(f"devrng check-resume: --steps is {steps}; give 1 or more.")
        return CANNOT
    if stop is not None and (stop < 1 or (steps is not None and stop >= steps)):
        out(f"devrng check-resume: --stop is {stop}; give a step from 1 to "
            f"{'--steps - 1' if steps is None else steps - 1}.")
        return CANNOT
    return checked("check-resume", command, keep, lambda runs: _check(runs, steps, stop))


def _check(runs: Runs, steps: int | None, stop: int | None) -> int:
    limit = {MAX_STEPS_VARIABLE: str(steps)} if steps is not None else {}
    straight = records(runs.run("1/3", "uninterrupted", "uninterrupted", limit))
    last = last_step(straight)
    if last == 0:
        raise no_steps("the uninterrupted run")
    stop = stop if stop is not None else max(1, last // 2)
    if stop >= last:
        raise CheckFailed(f"the uninterrupted run took {last} steps, so it cannot be stopped "
                          f"after step {stop}; give a smaller --stop.")
    what = f"stopped after its first checkpoint at or after step {stop}"
    stopped = records(runs.run("2/3", what, "resumed", {**limit, STOP_VARIABLE: str(stop)}))
    ends = {rank: _stopped_at(record) for rank, record in stopped.items()}
    if not ends or None in ends.values():
        checkpoints = sorted({s for r in stopped.values() for a in r["attempts"].values()
                              for s in a["checkpoints"]})
        raise CheckFailed(f"the run saved no checkpoint at or after step {stop} (its "
                          f"checkpoints: {', '.join(map(str, checkpoints)) or 'none'}), so there "
                          "is nothing to resume from; give a --stop at or before a step it "
                          "checkpoints at.")
    resumed = records(runs.run("3/3", "resumed from that checkpoint", "resumed", limit))
    return _compare(straight, resumed, ends)


def _stopped_at(record: dict[str, Any]) -> tuple[str, int] | None:
    for attempt, entry in record["attempts"].items():
        if entry["end"] and entry["end"][0] == "stop":
            return attempt, entry["end"][1]
    return None


def _compare(straight: dict[int, dict[str, Any]], resumed: dict[int, dict[str, Any]],
             ends: dict[int, tuple[str, int] | None]) -> int:
    if set(straight) != set(resumed):
        raise CheckFailed(f"the runs had different ranks ({sorted(straight)} and "
                          f"{sorted(resumed)}).")
    verdicts = [_verdict(straight[rank], resumed[rank], ends[rank],  # type: ignore[arg-type]
                         rank if len(straight) > 1 else None) for rank in sorted(straight)]
    for verdict in verdicts:
        if verdict.ok is not None:
            out(str(verdict))
    cannot = [v for v in verdicts if v.ok is None]
    if cannot:
        raise CheckFailed("; ".join(map(str, cannot)))
    return EXACT if all(v.ok for v in verdicts) else DIFFERS


def _verdict(straight: dict[str, Any], resumed: dict[str, Any], end: tuple[str, int],
             rank: int | None) -> Verdict:
    """One rank's verdict: its resumed steps against the uninterrupted run's."""
    stopped_attempt, checkpoint = end
    (reference,) = straight["attempts"].values() or [None]
    attempts = resumed["attempts"]
    after = [a for a in attempts.values() if a["from"] == (stopped_attempt, checkpoint)]
    if reference is None or not after:
        return Verdict(None, "", rank=rank, reason=(
            f"the resumed run did not resume from the checkpoint of step {checkpoint} (its "
            "flight record has no entry saying so): does the script load its checkpoint when "
            "it finds one?"))
    before = judge(reference, attempts[stopped_attempt], 1, checkpoint, exact="",
                   differs="the run is not reproducible from its seed: two runs differ before "
                           "any resume,", names=("the stopped run", "the uninterrupted run"))
    if before.difference is not None:
        return replace(before, rank=rank, difference=replace(
            before.difference, hint=before.difference.hint + ". Two runs of the script from "
            "one seed must agree before a resume can: seed before the model is built "
            "(devrng.TrainingRNG or devrng.manual_seed at the top of the script; the "
            "integrations' callbacks made before the model), turn on devrng.deterministic(), "
            "and run devrng check-determinism to find where they part"))
    last = max(reference["steps"], default=checkpoint)
    if last <= checkpoint:  # nothing to compare: never "exact" on no step
        return Verdict(None, "", rank=rank, reason=(
            f"the uninterrupted run recorded no step after the checkpoint of step {checkpoint}, "
            "so the resume has nothing to be compared with; give a larger --steps, or a --stop "
            "before its last checkpoint."))
    verdict = judge(reference, after[-1], checkpoint + 1, last, exact="resume exact",
                    differs="resume differs", after=f" after the checkpoint of step {checkpoint}",
                    names=("the resumed run", "the uninterrupted run"))
    return replace(verdict, rank=rank, context=f"checkpoint at step {checkpoint}")

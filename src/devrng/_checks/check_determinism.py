"""``devrng check-determinism``: run a training script twice (or more) from scratch with one
seed, compare their flight records step by step, and name where they part.

The first step whose records differ is named with what differed first, in causal order:
the generators at the step's start, the batch's indices (data order), its content, and
-- all of those equal -- what the step computed (the loss, the parameters after it).
A difference in the computation is then located one level down: the script runs twice
more up to that step with every op of that step recorded (``devrng._checks.ops``), and
the first op whose inputs are equal in both runs and whose outputs are not is named,
with the module it ran in and the fix where torch knows one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from devrng._checks.ops import Split, first_split, ops_path, read_ops
from devrng._checks.record import MAX_STEPS_VARIABLE, OPS_VARIABLE
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
from devrng._checks.verdict import RERUN, Verdict, judge, located

__all__ = ["check_determinism"]


def check_determinism(command: Sequence[str], *, steps: int | None = None, runs: int = 2,
                      keep: str | None = None, locate: bool = True) -> int:
    """Run ``command`` ``runs`` times from scratch and compare; the exit status (0 the same,
    1 they differ, 2 could not check)."""
    if steps is not None and steps < 1:
        out(f"devrng check-determinism: --steps is {steps}; give 1 or more.")
        return CANNOT
    if runs < 2:
        out(f"devrng check-determinism: --runs is {runs}; give 2 or more (runs to compare).")
        return CANNOT
    return checked("check-determinism", command, keep,
                   lambda found: _check(found, steps, runs, locate))


def _check(runs: Runs, steps: int | None, count: int, locate: bool) -> int:
    limit = {MAX_STEPS_VARIABLE: str(steps)} if steps is not None else {}
    found = [records(runs.run(f"{k}/{count}", "from scratch", f"run-{k}", limit))
             for k in range(1, count + 1)]
    if last_step(found[0]) == 0:
        raise no_steps("run 1")
    ranks = sorted(found[0])
    for k, other in enumerate(found[1:], 2):
        if sorted(other) != ranks:
            raise CheckFailed(f"the runs had different ranks (run 1: {ranks}, run {k}: "
                              f"{sorted(other)}).")
    verdicts = [_verdict(found, rank, rank if len(ranks) > 1 else None) for rank in ranks]
    cannot = [v for v in verdicts if v.ok is None]
    if cannot:
        raise CheckFailed("; ".join(map(str, cannot)))
    differing = [v for v in verdicts if v.difference is not None]
    if differing and locate:
        computed = [v for v in differing if v.difference.computed]  # type: ignore[union-attr]
        if computed:
            step = min(v.difference.step or 1 for v in computed)  # type: ignore[union-attr]
            wanted = {v.rank or 0 for v in computed
                      if v.difference.step == step}  # type: ignore[union-attr]
            splits, at = _locate(runs, step, limit, wanted)
            verdicts = [_with_split(v, splits.get(v.rank or 0), step, at) for v in verdicts]
    for verdict in verdicts:
        out(str(verdict))
    return DIFFERS if differing else EXACT


def _verdict(found: list[dict[int, dict[str, Any]]], rank: int, label: int | None) -> Verdict:
    """One rank's verdict: every run's steps against run 1's; the earliest difference."""
    reference = _attempt(found[0][rank])
    first_last = max(reference["steps"], default=0)
    verdicts = []
    for k, record in enumerate(found[1:], 2):
        other = _attempt(record[rank])
        last = max(other["steps"], default=0)
        verdict = judge(reference, other, 1, min(first_last, last), exact="deterministic",
                        differs=f"runs 1 and {k} differ" if len(found) > 2
                        else "the runs differ", names=(f"run {k}", "run 1"), hints=RERUN)
        if verdict.difference is None and verdict.ok and last != first_last:
            verdict = Verdict(None, "", reason=(
                f"run 1 took {first_last} steps and run {k} {last}: their first "
                f"{min(first_last, last)} matched ({verdict.compared}), but a run that takes "
                "another number of steps is not the same run (a stop on the clock, or on a "
                "value that differs below what the record compares); give --steps"))
        if verdict.ok is None:
            return replace(verdict, rank=label)
        verdicts.append(replace(verdict, span=".."))
    # The earliest difference of any run from run 1; else run 2's "deterministic".
    differing = [(v.difference.step or 0, k, v) for k, v in enumerate(verdicts)
                 if v.difference is not None]
    chosen = min(differing)[2] if differing else verdicts[0]
    return replace(chosen, rank=label)


def _attempt(record: dict[str, Any]) -> dict[str, Any]:
    """The one attempt of a run from scratch (the one with the most steps, if it has more)."""
    attempts = list(record["attempts"].values())
    return max(attempts, key=lambda a: len(a["steps"]))


_ATTEMPTS = 3  # pairs of locating runs at most


def _locate(runs: Runs, step: int, limit: dict[str, str],
            wanted: set[int]) -> tuple[dict[int, Split | str], int]:
    """Run the script twice up to ``step``, recording that step's ops; where they part, by
    rank (a sentence when they could not be compared), and the step it was found in. A
    difference that does not show at the same step in every run is followed: locating runs
    that part at an earlier step are run again up to that one, and a pair that did not part
    on each ``wanted`` rank is run again (a rank keeps the first place a pair parted)."""
    target = step
    parted: dict[int, Split] = {}
    for attempt in range(1, _ATTEMPTS + 1):
        last = attempt == _ATTEMPTS
        out(f"locating the difference in step {target}: two more runs up to it, with every op "
            "of that step recorded")
        extra = {**limit, MAX_STEPS_VARIABLE: str(target), OPS_VARIABLE: str(target)}
        directories = [runs.run(f"ops {k}/2", f"step {target}, every op recorded",
                                f"ops-{attempt}-{k}", extra) for k in (1, 2)]
        kept = [records(d) for d in directories]
        earlier = min((v.difference.step or 1 for rank in kept[0] if rank in kept[1]
                       and target > 1 and (v := judge(
                           _attempt(kept[0][rank]), _attempt(kept[1][rank]), 1, target - 1,
                           exact="", differs="", names=("ops 2", "ops 1"), hints=RERUN)
                       ).difference is not None), default=None)
        if earlier is not None and not last:
            out(f"the two runs parted earlier, at step {earlier}: locating there")
            target, parted = earlier, {}
            continue
        found: dict[int, Split | str] = {}
        for rank in kept[0]:
            paths = [ops_path(os.path.join(d, "flight-record"), rank) for d in directories]
            if earlier is not None:
                found[rank] = (f"the runs that recorded every op kept parting before the step "
                               f"they recorded (the last pair at step {earlier}), so the op is "
                               "not named: run the check again")
            elif not all(os.path.exists(p) for p in paths):
                found[rank] = (f"the ops of step {target} were not recorded (the run ended "
                               "before that step ended), so the op is not named")
            elif (split := first_split(read_ops(paths[0]), read_ops(paths[1]))) is not None:
                found[rank] = split
            else:
                found[rank] = (f"the two runs that recorded every op of step {target} did not "
                               "differ there (the difference does not show in every run: run "
                               "the check again, or with more --runs)")
        parted = {**{r: v for r, v in found.items() if isinstance(v, Split)}, **parted}
        found.update(parted)
        missing = sorted(r for r in wanted if not isinstance(found.get(r), Split))
        if last or not missing:
            return found, target
        where = "" if wanted == {0} and len(found) == 1 else \
            " on rank " + ", ".join(map(str, missing))
        out(f"the two runs did not part at step {target}{where}: running them again")
    raise AssertionError("unreachable")  # (the last attempt returns)


def _with_split(verdict: Verdict, split: Split | str | None, step: int, at: int) -> Verdict:
    difference = verdict.difference
    if difference is None or not difference.computed or difference.step != step \
            or split is None:
        return verdict
    if isinstance(split, str):
        return replace(verdict, difference=replace(difference, detail=split))
    # (The op's own words replace the causes a difference in the computation can have.)
    op = split.op
    return replace(verdict, difference=replace(
        difference, hint="", module=op.module if op else None, op=op.op if op else None,
        phase=op.phase if op else None,
        detail=located(split, at="" if at == step else
                       f" at step {at}, where the runs that recorded every op parted first")))

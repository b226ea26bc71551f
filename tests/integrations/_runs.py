"""Running the trainer programs of the resume matrix, and reading what they wrote.

Each program (``_lightning_run``, ``_accelerate_run``, ``_transformers_run``) runs a list
of jobs given as JSON:

    python -m tests.integrations._lightning_run OUT JOBS_JSON

- ``{"mode": "A", "name": NAME}``: the uninterrupted run of configuration NAME; its
  checkpoints go to ``OUT/NAME/ck``, its result to ``OUT/NAME/A.json``.
- ``{"mode": "first", "name": NAME}``: where the trainer has one, the first part as users
  write it (one epoch, then save), to ``OUT/NAME/first.*``.
- ``{"mode": "B", "name": NAME, "checkpoint": PATH, "tag": TAG, "changes": {...}}``: the
  run resumed from PATH (with ``changes``, e.g. ``{"workers": 3}``), to
  ``OUT/NAME/TAG.json``.

Importing a trainer costs most of a run (Lightning: about 7 of 8 CPU seconds here), so the
program imports it once and runs every job in a process of its own, forked from that one
before anything else happens: each run starts as a new process that imported the trainer
and did nothing else, and nothing of one job (generators, environment, the trainer's
globals) reaches another. Two jobs run at a time.

A result holds every training step's loss as ``float.hex`` (bitwise comparable), the
validation losses, a SHA-256 of the final weights' bytes, the global step, and the
``DevRNGWarning`` messages and the ``"devrng"`` log records the run produced; a job that
fails writes its traceback instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tests._helpers import run_python

SEED = 1234
PARALLEL = 2


def run(module: str, out: Path, jobs: list[dict[str, Any]]) -> None:
    """Run ``jobs`` with the program ``module`` in a new process."""
    proc = run_python(module, module=True, args=(str(out), json.dumps(jobs)), timeout=1800,
                      env={"PYTHONWARNINGS": "ignore", "HF_HUB_OFFLINE": "1",
                           "TRANSFORMERS_OFFLINE": "1"})
    assert proc.returncode == 0, f"{module}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


@dataclass
class Result:
    losses: list[str]
    val: list[str]
    weights: str
    steps: int
    warnings: list[str] = field(default_factory=list)
    logged: list[str] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)  # per epoch, where a program records them
    flight: list[str] = field(default_factory=list)  # what the flight record said (log lines)
    order: list[str] = field(default_factory=list)  # per epoch, the sample indices in order
    error: str = ""  # a resume refused with a DevRNGError: its message (no step was trained)

    @classmethod
    def read(cls, path: Path) -> Result:
        failed = path.with_suffix(".error")
        if failed.exists():
            raise AssertionError(f"the run for {path.name} failed:\n{failed.read_text()}")
        return cls(**json.loads(path.read_text()))

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.__dict__))


def is_exact(whole: Result, resumed: Result) -> bool:
    """Whether the resumed run continued the whole one bitwise: every resumed step's loss,
    every later validation loss, the step count and the final weights."""
    n, v = len(resumed.losses), len(resumed.val)
    return (resumed.losses == whole.losses[len(whole.losses) - n:]
            and resumed.val == whole.val[len(whole.val) - v:]
            and resumed.steps == whole.steps and resumed.weights == whole.weights)


def check_resumed(whole: Result, resumed: Result, expect: str, match: str = "") -> None:
    """Assert what a cell of a resume matrix expects of the resumed run: "exact" (or "exact
    alone": a control that is) with no warning; "differs" (a control without devrng); "warned":
    a DevRNGWarning matching ``match``, logged on "devrng" too, and indeed not exact; or
    "refused": the resume raised a DevRNGError matching ``match``."""
    if expect == "refused":
        assert re.search(match, resumed.error), resumed.error
        return
    assert not resumed.error, resumed.error
    if expect in ("exact", "exact alone"):
        assert is_exact(whole, resumed), (whole, resumed)
        assert resumed.warnings == [] and resumed.logged == []
    elif expect in ("differs", "silent"):  # ("silent": check_flight says what said so)
        assert not is_exact(whole, resumed)
    else:
        assert expect == "warned", expect
        assert any(re.search(match, w) for w in resumed.warnings), resumed.warnings
        assert any(re.search(match, m) for m in resumed.logged), resumed.logged
        assert not is_exact(whole, resumed), "warned, but the resumed run is exact"


FLIGHT = "devrng flight record:"


def check_flight(expect: str, resumed: Result, flagged: str = "", *, ended: bool = False
                 ) -> None:
    """What the flight record (on in every run here: ``main`` points the runs of one
    configuration at one record) said of a resumed run: an exact resume is verified, with no
    false alarm; a warned one is said to differ as the load warned, or unverified, never
    warned of again with another cause; a "silent" one (a control
    with one of devrng's fixes turned off: nothing devrng lists says a word) is flagged once,
    by the record alone, matching ``flagged`` (its first differing step and the cause);
    ``ended``: the checkpoint's run ended at it (nothing of it to compare with)."""
    said = " / ".join(resumed.flight)
    warned = [w for w in resumed.warnings if w.startswith(FLIGHT)]
    if expect == "exact" and ended:
        # A first part's checkpoint: the run that saved it ended there. The uninterrupted
        # run's record holds the same states at that step, but it is another run's and is
        # never compared: the resume is said to be unverifiable, for that reason.
        assert ("this resume cannot be verified: the run that saved this checkpoint ended "
                "there") in said, (said, resumed.warnings)
        assert not warned
    elif expect == "exact":
        assert "resume verified: steps" in said, (said, resumed.warnings)
        assert not warned
    elif expect == "warned":  # the load named the cause: the record names no other one
        assert not warned, resumed.warnings
        assert "as warned when it loaded" in said or "not verified" in said, said
    elif expect == "silent":
        assert [w for w in resumed.warnings if not w.startswith(FLIGHT)] == []
        assert len(warned) == 1 and re.search(flagged, warned[0]), warned


def digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's bytes: equal digests are bitwise-equal weights."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@contextlib.contextmanager
def devrng_messages() -> Iterator[tuple[list[str], list[str], list[str]]]:
    """(DevRNGWarning messages, ``"devrng"`` WARNING log records, the flight record's log
    lines) raised inside the block."""
    logged: list[str] = []
    flight: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if record.levelno >= logging.WARNING:
                logged.append(message)
            elif message.startswith("devrng flight record:"):
                flight.append(message)

    logger = logging.getLogger("devrng")
    handler = Keep(logging.INFO)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    found: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found, logged, flight
        found += [str(w.message) for w in caught if w.category.__name__ == "DevRNGWarning"]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def target(out: Path, job: dict[str, Any]) -> Path:
    """Where a job's result goes."""
    name = out / job["name"]
    return name / {"A": "A.json", "first": "first.json"}.get(job["mode"], f"{job.get('tag')}.json")


def job_runner(train: Callable[..., Result], configs: dict[str, dict[str, Any]]
               ) -> Callable[[Path, dict[str, Any]], None]:
    """The ``run_job`` of a trainer whose ``train(config, folder, resume=None)`` returns its
    Result: mode "A" runs uninterrupted, "B" resumes from the job's checkpoint, with its changes."""

    def run_job(out: Path, job: dict[str, Any]) -> None:
        name = job["name"]
        if job["mode"] == "A":
            result = train(configs[name], out / name)
        else:
            config = {**configs[name], **job.get("changes", {})}
            resume = Path(job["checkpoint"])
            if "chain" in config:  # a resume of a resumed run, saved as the whole run saves
                first = out / name / f"{job['tag']}-first"
                in_child(lambda: train({**config, "saves": True}, first, resume=resume))
                resume = first / "ck" / config["chain"]
            result = train(config, out / name / job["tag"], resume=resume)
        path = target(out, job)
        rank = int(os.environ.get("RANK", "0"))
        result.write(path.with_name(f"{path.stem}.rank{rank}.json") if rank else path)

    return run_job


def in_child(work: Callable[[], Any]) -> None:
    """Run ``work`` in a process forked from this one (before it changed anything: a new
    process of its own), and wait for it."""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            work()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert status == 0, f"the first resumed run failed (status {status})"


def main(argv: list[str], run_job: Callable[[Path, dict[str, Any]], None]) -> None:
    """Run each job of ``argv`` (OUT, JOBS_JSON) in a forked process, ``PARALLEL`` at a time."""
    out, jobs = Path(argv[0]), json.loads(argv[1])
    running: dict[int, dict[str, Any]] = {}
    failed = []
    for job in [*jobs, None]:
        while running and (job is None or len(running) >= PARALLEL):
            pid, status = os.wait()
            if status != 0:
                failed.append(running[pid])
            del running[pid]
        if job is None:
            break
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # the job's own process
            code = 0
            # One flight record for a configuration's runs: a resumed run compares its steps
            # with what the uninterrupted run recorded past the checkpoint it resumes from.
            os.environ["DEVRNG_FLIGHT_RECORD"] = str(out / job["name"] / "flight")
            try:
                run_job(out, job)
            except BaseException:
                path = target(out, job).with_suffix(".error")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(traceback.format_exc())
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        running[pid] = job
    if failed:
        print("failed:", json.dumps(failed), file=sys.stderr)

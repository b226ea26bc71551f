"""The flight record: what each step of a training run drew and consumed, to verify a resume.

devrng restores every generator it knows of, but a run can draw from places it cannot
list ahead of time: NumPy inside a ``collate_fn``, a sampler that a loader
fast-forwards by iterating it again, a trainer flag. So the run checks itself. For
every optimizer step, the record keeps a line of what the step started from and what
it consumed: the fingerprint of every generator devrng tracks when the step began, the
sample indices of each batch it took from a tracked loader and an exact digest of the
batch's content (``devrng._training.digest``), and optionally the loss. The lines go to
a small append-only file per rank beside the checkpoints.

When a run resumes from a checkpoint, the record finds the checkpoint in the file (by
the digest of the state that was saved), and compares the resumed run's steps with the
steps the interrupted run recorded after it. All equal: the resume is verified (an
info line on the ``"devrng"`` logger says so). The first step that differs is named,
with what differed and the known causes, in one ``DevRNGWarning``.

A step is an optimizer step (``torch.optim`` step hooks): with gradient accumulation it
holds every micro-batch consumed since the last step. The record only reads: it draws
nothing, and a run with it draws bitwise what the run without it draws.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import hashlib
import json
import logging
import os
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from devrng._backends.registry import device_count, get_backend, started_types
from devrng._base.errors import DevRNGError, short_repr, warn_and_log
from devrng._base.files import atomic_write
from devrng._base.locks import ForkSafeLock
from devrng._training.digest import (
    batch_parts,
    generator_fingerprint,
    indices_digest,
    numpy_fingerprint,
    python_fingerprint,
    resolve,
    state_fingerprint,
)
from devrng._training.loaders import feeding_loader

__all__ = ["FLIGHT_VARIABLE", "MAX_STEPS_VARIABLE", "STOP_VARIABLE", "FlightRecord", "explain",
           "global_sources", "read_record", "record_path"]

_logger = logging.getLogger("devrng")

#: Records into this directory, whatever the program asked (``devrng check-resume``).
FLIGHT_VARIABLE = "DEVRNG_FLIGHT_RECORD"
#: Ends the process at the start of the first step after a checkpoint at or after step K.
STOP_VARIABLE = "DEVRNG_STOP_AFTER"
#: Ends the process after step N.
MAX_STEPS_VARIABLE = "DEVRNG_MAX_STEPS"

_FORMAT = 1
#: Marks the fingerprint of a loader's own generator (its shuffle and worker seeds).
LOADER_PREFIX = "loader:"
_FLUSH_EVERY = 16  # steps written (and their device digests read) together
_FLUSH_SECONDS = 1.0  # ... or after this long
_SOURCES_EVERY = 64  # steps between two looks at what generators there are
PRUNE_BYTES = 1 << 18  # rewrite the file (dropping what no resume needs) past this size
_KEEP_CHECKPOINTS = 2  # a resume from either of the last two checkpoints can be verified


def record_path(directory: str, rank: int) -> str:
    """The file of rank ``rank``'s record in ``directory``."""
    return os.path.join(directory, f"devrng-flight.rank{rank}.jsonl")


Sources = Callable[[], list[tuple[str, Callable[[], Any]]]]
_numpy_reader: list[Callable[[], Any] | None] = []  # found once per process


def global_sources() -> list[tuple[str, Callable[[], Any]]]:
    """The process's global generators, to fingerprint: the CPU's, each started device's
    (``"cuda:0"``, ...), Python's and NumPy's."""
    found: list[tuple[str, Callable[[], Any]]] = [
        ("cpu", lambda: generator_fingerprint(torch.default_generator))]
    for name in started_types():
        backend = get_backend(name)
        for index in range(device_count(backend)):
            found.append((f"{name}:{index}", functools.partial(_device_fingerprint, backend,
                                                                 index)))
    found.append(("python", python_fingerprint))
    if not _numpy_reader:
        _numpy_reader.append(numpy_fingerprint())
    if _numpy_reader[0] is not None:
        found.append(("numpy", _numpy_reader[0]))
    return found


def _device_fingerprint(backend: Any, index: int) -> Any:
    return state_fingerprint(backend.get_rng_state(index))


class FlightRecord:
    """The flight record of one process of a training run: a line per optimizer step.

    ``TrainingRNG(..., flight_record=DIR)`` and the trainer integrations make one
    (``rng.flight``); it is not made directly. ``rng.flight.loss(loss)`` adds a step's loss
    to its line; after a resume, ``verified`` says whether the steps the interrupted run
    recorded past the checkpoint matched. See the resume page for what a line holds.

    Args:
        directory: Where the file goes (made if missing).
        rank: This process's rank (one file per rank).
        identity: What a record must share with this run to be compared (seed, world
            size, loaders), as plain data.
        sources: The generators to fingerprint, as ``(name, read)`` pairs (called at
            each step's start: what the run tracks may grow).
        hooked: True when a trainer integration says which batch a step consumes
            (``consume``, ``watch_model``); False when every batch a tracked loader
            delivers in the main thread is the step's (a plain loop). Settable until
            the first step.
        log: Also say what the record finds here (a trainer's logger).

    Examples:
        >>> import tempfile
        >>> rng = devrng.TrainingRNG(seed=0, flight_record=tempfile.mkdtemp())
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> model(torch.ones(2)).sum().backward()
        >>> opt.step()                     # an optimizer step: one line
        >>> rng.flight.step, rng.flight.verified
        (1, None)
    """

    __module__ = "devrng"

    def __init__(self, directory: str | os.PathLike[str], *, rank: int,
                 identity: Mapping[str, Any], sources: Sources, hooked: bool = False,
                 log: Callable[[str], None] | None = None) -> None:
        """Open the record's file (the arguments: see ``help(devrng.FlightRecord)``)."""
        directory = os.fspath(os.environ.get(FLIGHT_VARIABLE) or directory)
        try:
            os.makedirs(directory, exist_ok=True)
            self.path = record_path(directory, rank)
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                           0o644)
        except OSError as err:
            raise OSError(err.errno, f"devrng flight record: cannot keep the record in "
                                     f"{directory!r} ({err.strerror or err}); give a directory "
                                     "this process can write") from None
        self._broken = False
        self.attempt = os.urandom(4).hex()
        self.step = 0  # optimizer steps completed (after a resume: counted from the checkpoint's)
        self.identity = dict(identity)
        self._sources = sources
        self._readers: list[tuple[str, Callable[[], Any]]] | None = None
        self.hooked = hooked
        self.log = log
        self._pid = os.getpid()
        self._lock = ForkSafeLock()
        self._names: list[str] = []
        self._start: dict[str, Any] | None = None  # fingerprints at this step's start
        self._batches: list[tuple[Any, Any, int | None, str]] = []  # (indices, content, pos, loader)
        self._losses: list[Any] = []
        self._pending: list[dict[str, Any]] = []  # finished steps not written yet
        self._flushed = time.monotonic()
        # The interrupted run's steps to compare, each with its generator names.
        self._expected: dict[int, tuple[dict[str, Any], list[str]]] = {}
        self._verified: tuple[int, int] | None = None
        self._diverged = False
        self._last_checkpoint: int | None = None
        self._stop_after = _int_variable(STOP_VARIABLE)
        self._max_steps = _int_variable(MAX_STEPS_VARIABLE)
        self._watched: dict[str, _Watched] = {}
        self._model_hooks: list[Any] = []
        self._write({"k": "run", "v": _FORMAT, "a": self.attempt, "id": self.identity,
                     "pid": self._pid})
        ref = weakref.ref(self)
        self._optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._hook = register_optimizer_step_post_hook(
            lambda optimizer, *_: _step_ended(ref, optimizer))
        _open.add(self)

    # -- what a step started from and consumed ----------------------------------------------
    def watch(self, name: str, loader: Any) -> None:
        """See the batches ``loader`` (a ``torch.utils.data.DataLoader``, or a trainer's or
        device's loader feeding from one) delivers."""
        loader = feeding_loader(loader)
        # accelerate's prepared loaders iterate a DataLoader they keep (base_dataloader).
        loader = vars(loader).get("base_dataloader", loader) if hasattr(loader, "__dict__") \
            else loader
        if name not in self._watched and isinstance(loader, torch.utils.data.DataLoader) \
                and "_devrng_flight" not in loader.__dict__:  # (not watched by another record)
            self._watched[name] = _Watched(self, name, loader)

    def begin_step(self) -> None:
        """The step under way starts now (its generators' fingerprints are taken now)."""
        with self._lock:
            if self._start is not None:
                return
            if self._stopping():
                self._stop("stop", f"{STOP_VARIABLE}={self._stop_after}")
            self._start = self._fingerprints()

    def consume(self, batch: Any, *, loader: str | None = None) -> None:
        """The step takes ``batch`` (a trainer integration's hook says which): its content is
        digested as the step sees it, and its indices are those of the oldest batch a
        watched loader (``loader``, or any) delivered and no step took yet."""
        with self._lock:
            self.begin_step()
            delivered = None
            for name in [loader] if loader is not None else list(self._watched):
                watched = self._watched.get(name)  # type: ignore[arg-type]
                if watched is not None and watched.delivered:
                    delivered = watched.delivered.popleft()
                    break
            indices, _, position, name = delivered or (None, None, None, "")
            self._batches.append((indices, batch_parts(batch), position, name))

    def watch_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Count only the steps of ``optimizer`` (and of others given so): by default every
        ``torch.optim`` optimizer of the process ends a step. A trainer's wrapper counts as
        the optimizer it wraps."""
        self._optimizers.add(getattr(optimizer, "optimizer", optimizer))

    def watch_model(self, module: torch.nn.Module) -> None:
        """Each forward of ``module`` in training mode is a batch the step consumes (its
        inputs), and a ``.loss`` in what it returns is the step's loss: for trainers whose
        hooks do not see the batch (HF ``Trainer``, accelerate)."""
        ref = weakref.ref(self)

        def before(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            record = ref()
            if record is not None and module.training:
                record.consume((args, kwargs))

        def after(module: torch.nn.Module, args: Any, output: Any) -> None:
            record = ref()
            loss = output.get("loss") if isinstance(output, Mapping) \
                else getattr(output, "loss", None)
            if record is not None and module.training and isinstance(loss, torch.Tensor) \
                    and loss.numel() == 1:
                record.loss(loss)

        self._model_hooks += [module.register_forward_pre_hook(before, with_kwargs=True),
                              module.register_forward_hook(after)]

    def loss(self, value: Any) -> None:
        """Add the loss of the step under way to its line (a float or a one-element tensor,
        read when the line is written, not now: no host synchronisation per step)."""
        with self._lock:
            if isinstance(value, torch.Tensor):
                value = value.detach()
                if value.numel() != 1:
                    raise ValueError(f"flight.loss takes one number, not a tensor of shape "
                                     f"{tuple(value.shape)}.")
                self._losses.append(value.reshape(()))  # read when the line is written
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                self._losses.append(float(value))
            else:
                raise TypeError(f"flight.loss takes a number or a one-element tensor, not "
                                f"{short_repr(value)}.")

    def end_step(self) -> None:
        """An optimizer stepped: the step under way ends (the optimizer hook calls this)."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            if self._start is None:  # no batch came from a tracked loader: fingerprints now
                self.begin_step()
            self.step += 1
            line: dict[str, Any] = {"s": self.step, "a": self.attempt, "g": self._start}
            if self._batches:
                indices = [b[0] for b in self._batches]
                line["n"] = len(self._batches)
                line["b"] = [b[1] for b in self._batches]
                line["i"] = None if None in indices else indices_digest(indices)
                first = self._batches[0]
                line["p"] = [first[3], first[2]]
            if self._losses:
                line["l"] = self._losses
            self._start, self._batches, self._losses = None, [], []
            self._pending.append(line)
            # Written (and compared) in batches: every 16 steps, or once a second for slow
            # steps (a job killed after its checkpoint has its steps past it on disk), and at
            # the last step a resume is compared on, so that its verdict comes then, not at exit.
            now = time.monotonic()
            if len(self._pending) >= _FLUSH_EVERY or now - self._flushed >= _FLUSH_SECONDS or (
                    self._expected and self._verified is not None
                    and self.step >= self._verified[1]):
                self.flush()
            if self._max_steps is not None and self.step >= self._max_steps:
                self._stop("end", f"{MAX_STEPS_VARIABLE}={self._max_steps}")

    # -- checkpoints and resumes ------------------------------------------------------------
    def checkpoint(self, key: str) -> None:
        """A checkpoint holds the state whose digest is ``key``: note it with this step, so
        that a run resumed from it finds where it was."""
        with self._lock:
            self.flush()
            self._write({"k": "ckpt", "a": self.attempt, "s": self.step, "key": key})
            self._last_checkpoint = self.step
            self._file_op(self._sync_and_prune)

    def resume(self, key: str, *, step: int | None = None) -> None:
        """This run continues from the checkpoint whose state digest is ``key``: count steps
        from its step, and compare the coming steps with those its run recorded after it.

        ``step`` is the checkpoint's step when the caller knows it (a trainer's global step).
        """
        with self._lock:
            try:
                lines, damaged = _read_lines(self.path)
            except OSError as err:
                self._say(f"this resume cannot be verified: {self.path} cannot be read "
                          f"({err.strerror or err})")
                return
            found = _find_checkpoint(lines, key)
            if found is None:
                self.step = step if step is not None else self.step
                self._say("this resume cannot be verified: the flight record in "
                          f"{os.path.dirname(self.path)} holds no entry for the checkpoint it "
                          "resumed from (it was written by another run, elsewhere, or before "
                          "the record was on)")
                return
            index, attempt, saved_step = found
            self.step = saved_step
            self._readers = None  # what this run has to fingerprint, asked now
            header = _header_of(lines, attempt)
            self._write({"k": "from", "a": self.attempt, "from": attempt, "s": saved_step})
            other = _identity_problem(header.get("id") if header else None, self.identity)
            if other:
                self._say(f"the steps after the checkpoint (step {saved_step}) are not compared "
                          f"with the run that wrote it: {other}")
                return
            expected = _steps_after(lines, index, attempt)
            if not expected:
                self._say(f"this resume cannot be verified: the interrupted run recorded nothing "
                          f"past its checkpoint at step {saved_step} (it stopped right after "
                          "saving)" + _damaged(damaged))
                return
            self._expected = expected
            self._verified = (saved_step + 1, max(expected))

    @property
    def verified(self) -> bool | None:
        """After a resume: True once every step the interrupted run recorded past the
        checkpoint matched, False if one differed, None while undecided or not compared.
        Steps are compared as they are written: every 16 steps, after a second, at a
        checkpoint, at the last step compared, and at ``finish()``."""
        if self._diverged:
            return False
        if self._verified is not None and not self._expected and self._verified[0] <= self.step:
            return True
        return None

    # -- the file -------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the finished steps (reading their device digests, together)."""
        with self._lock:
            if not self._pending or os.getpid() != self._pid:
                return
            lines = resolve(self._pending)
            self._pending = []
            self._flushed = time.monotonic()
            for line in lines:
                if "l" in line:  # losses left on a device: read now, with the digests
                    line["l"] = [float(v) for v in line["l"]]
                names = list(line["g"])
                if names != self._names:
                    self._names = names
                    self._write({"k": "names", "a": self.attempt, "names": names})
                compact = dict(line, g=[line["g"][n] for n in names])
                if "b" in compact:
                    compact["b"] = _combine(compact["b"])
                if "l" in compact:
                    compact["l"] = [v.hex() for v in compact["l"]]
                self._write(compact)
                self._compare(compact, names)

    def finish(self) -> None:
        """The run is done training (a trainer's end, or the process's): write what is left,
        and say how far a resume was verified if the run ended before the steps that the
        interrupted run recorded past the checkpoint."""
        with self._lock:
            self.flush()
            if not self._expected or self._diverged or self._verified is None:
                return
            first, last = self._verified
            self._expected.clear()
            if self.step >= first:
                self._say(f"resume verified for steps {first:,} to {self.step:,}; the run ended "
                          f"there, before steps {self.step + 1:,} to {last:,}, which the "
                          "interrupted run recorded")
            else:
                self._say(f"this resume was not verified: the run ended at step {self.step:,}, "
                          f"before step {first:,}, the first the interrupted run recorded past "
                          "its checkpoint")

    def close(self) -> None:
        """Write what is left and stop recording (at exit, or when its owner is done)."""
        with self._lock:
            self.finish()
            self._hook.remove()
            for handle in self._model_hooks:
                handle.remove()
            for watched in self._watched.values():
                watched.unwatch()
            self._watched.clear()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            _open.discard(self)

    def _write(self, line: Mapping[str, Any]) -> None:
        data = encode_line(line).encode()

        def write() -> None:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, data)  # one write: a whole line, or (killed) a torn one, skipped

        self._file_op(write)

    def _file_op(self, work: Callable[[], None]) -> None:
        """Do ``work`` on the file, unless it failed before; a failure (a full disk) stops the
        record with one warning and never the training."""
        if os.getpid() != self._pid or self._broken:
            return
        try:
            work()
        except OSError as err:
            self._broken = True
            warn_and_log(f"devrng flight record: {self.path} cannot be written "
                         f"({err.strerror or err}); the record is stopped and this run's "
                         "resumes will not be verified. The training goes on.", stacklevel=4)

    def _sync_and_prune(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)  # the checkpoint's line is on disk with the checkpoint
        self._prune()

    def _prune(self) -> None:
        """Drop what no resume from the last checkpoints needs, once the file is large."""
        if os.path.getsize(self.path) < PRUNE_BYTES:
            return
        lines, _ = _read_lines(self.path)
        checkpoints = [i for i, line in enumerate(lines) if line.get("k") == "ckpt"]
        if len(checkpoints) <= _KEEP_CHECKPOINTS:
            return
        kept = lines[checkpoints[-_KEEP_CHECKPOINTS]:]
        attempts = dict.fromkeys(line.get("a") for line in kept)
        headers = [line for line in lines if line.get("k") == "run" and line.get("a") in attempts]
        names = {}  # the names in force for each attempt where the kept lines begin
        for line in lines[:checkpoints[-_KEEP_CHECKPOINTS]]:
            if line.get("k") == "names":
                names[line.get("a")] = line
        text = "".join(encode_line(line) for line in [*headers, *names.values(), *kept])
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        atomic_write(self.path, lambda fh: fh.write(text.encode()))

    # -- comparing -------------------------------------------------------------------------------
    def _compare(self, line: Mapping[str, Any], names: list[str]) -> None:
        expected = self._expected.pop(line["s"], None)
        if expected is None or self._diverged:
            return
        problem = explain(expected[0], expected[1], line, names)
        if problem is not None:
            self._diverged = True
            self._expected.clear()
            first = self._verified[0] if self._verified is not None else line["s"]
            before = (f" Steps {first:,} to {line['s'] - 1:,} matched." if line["s"] > first
                      else " It is the first step after the checkpoint.")
            message = (f"devrng flight record: the resumed run differs from the interrupted one "
                       f"at {problem}.{before}")
            warn_and_log(message, stacklevel=2)
            if self.log is not None:
                self.log(message)
        elif not self._expected and self._verified is not None:
            first, last = self._verified
            self._say(f"resume verified: steps {first:,} to {last:,} drew and consumed exactly "
                      "what the interrupted run did", level=logging.INFO)

    def _say(self, message: str, level: int = logging.INFO) -> None:
        _logger.log(level, "devrng flight record: %s.", message)
        if self.log is not None:
            self.log(f"devrng flight record: {message}.")

    # -- fingerprints -------------------------------------------------------------------------------

    def _fingerprints(self) -> dict[str, Any]:
        # What to read is asked again now and then (a device may start, a loader be tracked),
        # not at every step: asking costs more than reading.
        if self._readers is None or self.step % _SOURCES_EVERY == 0:
            self._readers = self._sources()
        found = {}
        for name, read in self._readers:
            try:
                found[name] = read()
            except Exception as err:  # a generator that cannot be read now: say which
                found[name] = f"unreadable: {type(err).__name__}"
        return found

    # -- stopping (devrng check-resume) -------------------------------------------------------------
    def _stopping(self) -> bool:
        return (self._stop_after is not None and self._last_checkpoint is not None
                and self._last_checkpoint >= self._stop_after)

    def _stop(self, kind: str, why: str) -> None:
        """End the process now, as a killed job ends (no clean-up), after the record is
        written: what ``devrng check-resume`` asked for."""
        self.flush()
        self._write({"k": kind, "a": self.attempt, "s": self.step})
        self._file_op(lambda: os.fsync(self._fd) if self._fd is not None else None)
        _logger.info("devrng flight record: ending the process after step %d (%s).",
                     self.step, why)
        os._exit(0)


def _step_ended(ref: weakref.ref[FlightRecord], optimizer: Any) -> None:
    record = ref()
    if record is not None and (not record._optimizers or optimizer in record._optimizers):
        record.end_step()


_open: weakref.WeakSet[FlightRecord] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for record in list(_open):
        # The process is ending: a record that cannot be written now is lost, not an error.
        with contextlib.suppress(Exception):
            record.close()


def _int_variable(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise DevRNGError(f"{name} is {raw!r}; it takes a step number (an int of 0 or more).")
    return value


def _combine(digests: list[str]) -> str:
    return digests[0] if len(digests) == 1 else \
        hashlib.blake2b("".join(digests).encode(), digest_size=8).hexdigest()


def encode_line(line: Mapping[str, Any]) -> str:
    """One line of a record file: the JSON text, a space and its CRC-32 (what a reader checks:
    a torn or altered line is skipped)."""
    text = json.dumps(line, separators=(",", ":"))
    return f"{text} {zlib.crc32(text.encode()) & 0xFFFFFFFF:08x}\n"


# -- reading a record ------------------------------------------------------------------------

def _read_lines(path: str) -> tuple[list[dict[str, Any]], int]:
    """Every whole, undamaged line of a record file, and how many were not."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return [], 0
    lines, damaged = [], 0
    for row in raw.split(b"\n"):
        if not row:
            continue
        text, _, crc = row.rpartition(b" ")
        try:
            if f"{zlib.crc32(text) & 0xFFFFFFFF:08x}".encode() != crc:
                raise ValueError
            line = json.loads(text)
            if not isinstance(line, dict):
                raise ValueError
        except ValueError:
            damaged += 1
            continue
        lines.append(line)
    return lines, damaged


def read_record(path: str) -> dict[str, Any]:
    """A record file as ``{"attempts": {attempt: {"id", "steps": {s: line}, "names"...}},
    "damaged": n}`` (what ``devrng check-resume`` compares)."""
    lines, damaged = _read_lines(path)
    attempts: dict[str, dict[str, Any]] = {}
    names: dict[str, list[str]] = {}
    for line in lines:
        attempt = str(line.get("a"))
        entry = attempts.setdefault(attempt, {"id": None, "steps": {}, "checkpoints": [],
                                              "from": None, "end": None})
        kind = line.get("k")
        if kind == "run":
            entry["id"] = line.get("id")
        elif kind == "names":
            names[attempt] = line.get("names", [])
        elif kind == "ckpt":
            entry["checkpoints"].append(line.get("s"))
        elif kind == "from":
            entry["from"] = (line.get("from"), line.get("s"))
        elif kind in ("stop", "end"):
            entry["end"] = (kind, line.get("s"))
        elif kind is None and isinstance(line.get("s"), int):
            entry["steps"][line["s"]] = (line, list(names.get(attempt, [])))
    return {"attempts": attempts, "damaged": damaged}


def _find_checkpoint(lines: list[dict[str, Any]], key: str) -> tuple[int, str, int] | None:
    """The checkpoint line with ``key`` whose run recorded the most steps after it (two runs
    can hold the same state at the same step; the latest of equals)."""
    best: tuple[int, int, str, int] | None = None
    for index, line in enumerate(lines):
        if line.get("k") == "ckpt" and line.get("key") == key and isinstance(line.get("s"), int):
            after = len(_steps_after(lines, index, line["a"]))
            if best is None or after >= best[0]:
                best = (after, index, line["a"], line["s"])
    return None if best is None else best[1:]


def _header_of(lines: list[dict[str, Any]], attempt: str) -> dict[str, Any] | None:
    for line in lines:
        if line.get("k") == "run" and line.get("a") == attempt:
            return line
    return None


def _steps_after(lines: list[dict[str, Any]], index: int, attempt: str
                 ) -> dict[int, tuple[dict[str, Any], list[str]]]:
    """The steps ``attempt`` recorded after line ``index``, each with the generator names
    its fingerprints are in the order of."""
    names: list[str] = []
    for line in lines[:index]:
        if line.get("k") == "names" and line.get("a") == attempt:
            names = line.get("names", [])
    steps: dict[int, tuple[dict[str, Any], list[str]]] = {}
    for line in lines[index + 1:]:
        if line.get("a") != attempt:
            continue
        if line.get("k") == "names":
            names = line.get("names", [])
        elif line.get("k") is None and isinstance(line.get("s"), int):
            steps[line["s"]] = (line, names)
    return steps


def _identity_problem(saved: Any, now: Mapping[str, Any]) -> str | None:
    if not isinstance(saved, Mapping):
        return "its record has no description of the run"
    differ = [f"{key} {short_repr(saved.get(key))} then, {short_repr(now.get(key))} now"
              for key in dict.fromkeys([*saved, *now]) if saved.get(key) != now.get(key)]
    return ("it was another run or configuration (" + "; ".join(differ) + ")") if differ else None


def _damaged(count: int) -> str:
    return f"; {count} damaged line(s) of the record were skipped" if count else ""


# -- what differs, in words --------------------------------------------------------------------

_HINTS = {
    "content": ("randomness inside the dataset or collate_fn that devrng does not see (draw it "
                "inside devrng.sample_rng(index), or seed it from the batch's indices)"),
    "indices": ("the loader's sampler shuffled differently (a sampler with a generator of its "
                "own, or one a loader fast-forwards by iterating it again: build the loader "
                "with **rng.dataloader_kwargs() and use torchdata's StatefulDataLoader)"),
    "count": "another number of batches per optimizer step (gradient accumulation or the loader)",
    "loss": ("nondeterministic kernels (turn on devrng.deterministic()), or model or optimizer "
             "state the checkpoint does not hold (a gradient accumulated inside a window, an "
             "LR scheduler, a buffer)"),
}


def _generator_hint(name: str) -> str:
    if name in ("python", "numpy"):
        return (f"something drew from the {'Python' if name == 'python' else 'NumPy'} global "
                "generator in one run and not in the other (a collate_fn, a callback, a "
                "library) or its state was not restored")
    return ("something drew from it in one run and not in the other between the checkpoint and "
            "this step, or its state was not restored")


def explain(theirs: Mapping[str, Any], their_names: list[str], ours: Mapping[str, Any],
            our_names: list[str]) -> str | None:
    """Where two records of the same step differ, as the words after "at", or None.

    Examples:
        >>> from devrng._training.flight import explain
        >>> a = {"s": 7, "g": ["0a", "0b"], "n": 1, "b": "c1", "i": "d1"}
        >>> explain(a, ["cpu", "numpy"], dict(a, b="c2"), ["cpu", "numpy"])[:59]
        "step 7: the batch's indices match and its content does not:"
        >>> explain(a, ["cpu", "numpy"], dict(a, g=["0a", "0c"]), ["cpu", "numpy"])[:56]
        "step 7: at the step's start the generator numpy differed"
        >>> explain(a, ["cpu", "numpy"], a, ["cpu", "numpy"]) is None
        True
    """
    step = ours.get("s")
    where = f"step {step:,}" if isinstance(step, int) else "a step"
    position = ours.get("p")
    if isinstance(position, list) and len(position) == 2 and position[1] is not None:
        where += f" (batch {position[1] + 1} of its epoch from loader {position[0]!r})"
    theirs_g = dict(zip(their_names, theirs.get("g") or [], strict=False))
    ours_g = dict(zip(our_names, ours.get("g") or [], strict=False))
    differ = [n for n in ours_g if n in theirs_g and theirs_g[n] != ours_g[n]]
    # A loader's own generators act only through its batches, and it draws from them when it
    # prefetches (how far ahead: its workers): on their own they say nothing; beside a batch
    # that differs, they tell why.
    primary = [n for n in differ if not n.startswith(LOADER_PREFIX)]
    loaders = [n.removeprefix(LOADER_PREFIX) for n in differ if n.startswith(LOADER_PREFIX)]
    if primary:
        same = [_shown(n) for n in ours_g if n in theirs_g and n not in differ]
        return (f"{where}: at the step's start the generator{'s' if len(primary) > 1 else ''} "
                f"{', '.join(primary)} differed" + (f" ({', '.join(same)} matched)" if same else "")
                + f": {_generator_hint(primary[0])}")
    also = (f" (the loader's generator{'s' if len(loaders) > 1 else ''} {', '.join(loaders)} "
            "differed at the step's start too)") if loaders else ""
    if theirs.get("n") != ours.get("n"):
        return (f"{where}: the step consumed {ours.get('n') or 0} batch(es) here and "
                f"{theirs.get('n') or 0} in the interrupted run{also}: {_HINTS['count']}")
    if theirs.get("b") != ours.get("b"):
        if theirs.get("i") is not None and ours.get("i") is not None:
            if theirs["i"] == ours["i"]:
                return (f"{where}: the batch's indices match and its content does not{also}: "
                        f"{_HINTS['content']}")
            return (f"{where}: the batch holds other samples (its indices differ){also}: "
                    f"{_HINTS['indices']}")
        return (f"{where}: the batch's content differs (its indices were not recorded){also}: "
                f"{_HINTS['indices']}, or {_HINTS['content']}")
    if theirs.get("l") is not None and ours.get("l") is not None and theirs["l"] != ours["l"]:
        return (f"{where}: the batch and every generator matched and the loss did not: "
                f"{_HINTS['loss']}")
    return None


def _shown(name: str) -> str:
    return name.removeprefix(LOADER_PREFIX)


# -- seeing the batches of a DataLoader ---------------------------------------------------------

class _Watched:
    """One DataLoader whose batches the record sees: each batch as it is delivered (its
    content digest, and the sample indices its batch sampler yielded for it)."""

    def __init__(self, record: FlightRecord, name: str, loader: Any) -> None:
        self.record = weakref.ref(record)
        self.name = name
        self.loader = weakref.ref(loader)
        self.delivered: collections.deque[tuple[Any, Any, int | None, str]] = \
            collections.deque(maxlen=256)
        self.indices: dict[int, Any] = {}  # yield number -> what the index source yielded
        self.yielded = 0
        self.offset = 0  # send id - yield number, for loaders with workers
        # Weak references both ways: the loader must not be kept in a cycle (see _iterator).
        watched, loader_ref = weakref.ref(self), weakref.ref(loader)
        # Another wrapper devrng put there (TrainingRNG's record of each epoch's generators)
        # runs inside this one.
        self._inner: Callable[[], Any] | None = loader.__dict__.get("_get_iterator")

        def get_iterator() -> Any:
            this, target = watched(), loader_ref()
            if target is None:  # (the loader calls this: it exists)
                raise ReferenceError("the DataLoader is gone")
            if this is None:  # the record is gone: the loader's own way
                return type(target)._get_iterator(target)
            return this._iterator(target)

        loader._get_iterator = get_iterator
        loader._devrng_flight = True

    def unwatch(self) -> None:
        loader = self.loader()
        if loader is not None:
            loader.__dict__.pop("_devrng_flight", None)
            if self._inner is None:
                loader.__dict__.pop("_get_iterator", None)
            else:
                loader._get_iterator = self._inner

    def _iterator(self, loader: Any) -> Any:
        key = "batch_sampler" if loader.__dict__.get("batch_sampler") is not None else "sampler"
        real = loader.__dict__.get(key)
        tap = real is not None and not isinstance(
            real, torch.utils.data.dataloader._InfiniteConstantSampler)
        if tap:
            loader.__dict__[key] = _IndexSource(real, self)
        try:
            it = self._inner() if self._inner is not None else type(loader)._get_iterator(loader)
        finally:
            if tap:
                loader.__dict__[key] = real
        if tap:
            # What construction drew past (a fast-forward) is not a batch; what it sent to
            # workers ahead (prefetch) is, numbered from the next batch to arrive.
            outstanding = getattr(it, "_send_idx", 0) - getattr(it, "_rcvd_idx", 0)
            first = self.yielded - outstanding
            self.indices = {k: v for k, v in self.indices.items() if k >= first}
            self.offset = getattr(it, "_rcvd_idx", 0) - first
        # The wrapper holds the iterator weakly: a cycle through it would leave the iterator
        # to the garbage collector, which may run in a forked worker (whose clean-up then
        # fails: "can only test a child process").
        ref = weakref.ref(it)
        next_data = type(it)._next_data
        in_order = getattr(it, "_in_order", True) and tap
        watched = self

        def _next_data() -> Any:
            iterator = ref()
            record = watched.record()
            main = threading.current_thread() is threading.main_thread()
            plain = record is not None and not record.hooked and main
            if plain:
                had = record._start  # type: ignore[union-attr]
                record.begin_step()  # type: ignore[union-attr]
            try:
                data = next_data(iterator)
            except StopIteration:
                if plain and had is None:  # the epoch ended: the step starts with the next one
                    record._start = None  # type: ignore[union-attr]
                raise
            if record is not None:
                watched._deliver(record, iterator, data, in_order, plain)
            return data

        it._next_data = _next_data
        return it

    def _deliver(self, record: FlightRecord, it: Any, data: Any, in_order: bool,
                 plain: bool) -> None:
        indices = None
        if in_order:
            if hasattr(it, "_send_idx"):
                number = getattr(it, "_rcvd_idx", 0) - 1 - self.offset
            else:
                number = self.yielded - 1
            indices = self.indices.pop(number, None)
            for k in [k for k in self.indices if k < number]:
                del self.indices[k]
        position = getattr(it, "_num_yielded", None)
        # A step a trainer's hook feeds is digested as the step sees it (consume).
        entry = (indices, batch_parts(data) if plain else None, position, self.name)
        with record._lock:
            if plain:
                record._batches.append(entry)
            else:
                self.delivered.append(entry)

    def new_pass(self) -> None:
        self.indices.clear()
        self.delivered.clear()  # a new iterator: what the last one delivered ahead is dropped
        self.yielded = 0
        self.offset = 0

    def saw(self, item: Any) -> None:
        self.indices[self.yielded] = item
        self.yielded += 1


class _IndexSource:
    """Stands for a loader's sampler or batch sampler while the loader builds an iterator:
    yields what it yields and tells the record each item; everything else is the real one's."""

    def __init__(self, real: Any, watched: _Watched) -> None:
        self._real = real
        self._watched = watched

    def __iter__(self) -> Iterator[Any]:
        self._watched.new_pass()
        return _IndexIterator(iter(self._real), self._watched)

    def __len__(self) -> int:
        return len(self._real)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _IndexIterator:
    def __init__(self, it: Iterator[Any], watched: _Watched) -> None:
        self._it = it
        self._watched = watched

    def __iter__(self) -> _IndexIterator:
        return self

    def __next__(self) -> Any:
        item = next(self._it)
        self._watched.saw(item)
        return item

    def __getattr__(self, name: str) -> Any:  # a stateful sampler iterator's state_dict
        return getattr(self._it, name)

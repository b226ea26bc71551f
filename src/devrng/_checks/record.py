"""The flight record: what each step of a training run drew, consumed and computed, to verify a resume.

devrng restores every generator it knows of, but a run can draw from places it cannot
list ahead of time: NumPy inside a ``collate_fn``, a sampler that a loader
fast-forwards by iterating it again, a trainer flag. So the run checks itself. For
every optimizer step, the record keeps a line of what the step started from, what it
consumed and what it computed: the fingerprint of every generator devrng tracks when the
step began, the sample indices of each batch it took from a tracked loader and an exact
digest of the batch's content (``devrng._checks.digest``), a sampled exact digest of
the parameters after the step, and optionally the loss. The lines go to a small
append-only file per rank beside the checkpoints, each before the next step begins.

Every save draws a key of its own, kept in the saved state and noted in the record. When
a run resumes, the record finds the line of that key -- written by the very attempt that
saved the checkpoint, never another run's -- and compares the resumed run's steps with the
steps that attempt recorded after it (``devrng._checks.compare``). All equal: the
resume is verified. The first step that differs is named, with what differed and the
known causes, in one ``DevRNGWarning``. What the record says besides a difference (a
resume verified, or not verifiable and why) goes to the ``"devrng"`` logger when logging
is set up for it, and otherwise to standard error: a plain script sees it too.

A step is an optimizer step (``torch.optim`` step hooks): with gradient accumulation it
holds every micro-batch consumed since the last step. The record only reads: it draws
nothing, and a run with it draws bitwise what the run without it draws.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import logging
import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from devrng._backends.registry import device_count, get_backend, started_types
from devrng._base.errors import DevRNGError, say, short_repr, warn_and_log
from devrng._base.files import atomic_write
from devrng._base.locks import ForkSafeLock
from devrng._checks.compare import (
    compared_parts,
    encode_line,
    find_checkpoint,
    header_of,
    identity_problem,
    read_lines,
    steps_after,
)
from devrng._checks.digest import (
    Pending,
    Views,
    batch_digest,
    generator_fingerprint,
    indices_digest,
    numpy_fingerprint,
    python_fingerprint,
    resolve,
    state_fingerprint,
)
from devrng._checks.ops import Ops, ops_path, write_ops
from devrng._checks.verdict import (
    Verdict,
    compared_text,
    damaged,
    difference,
    not_found,
    nothing_after,
)
from devrng._checks.watch import Watched, feeding_loader

__all__ = ["FLIGHT_VARIABLE", "MAX_STEPS_VARIABLE", "OPS_VARIABLE", "STOP_VARIABLE",
           "FlightRecord", "global_sources", "new_key", "record_path"]

_logger = logging.getLogger("devrng")

#: Records into this directory, whatever the program asked (``devrng check-resume``).
FLIGHT_VARIABLE = "DEVRNG_FLIGHT_RECORD"
#: Ends the process at the start of the first step after a checkpoint at or after step K.
STOP_VARIABLE = "DEVRNG_STOP_AFTER"
#: Ends the process after step N.
MAX_STEPS_VARIABLE = "DEVRNG_MAX_STEPS"
#: Records every op of step S (and the modules they ran in) beside the record, then ends the
#: process (``devrng check-determinism`` locating a difference in the computation).
OPS_VARIABLE = "DEVRNG_RECORD_OPS"

_FORMAT = 1
_SOURCES_EVERY = 64  # steps between two looks at what generators there are
PRUNE_BYTES = 1 << 18  # rewrite the file (dropping what no resume needs) past this size
_KEEP_CHECKPOINTS = 2  # a resume from either of the last two checkpoints can be verified
#: Parameter tensors digested after each step: the first and the last (a difference anywhere
#: in the forward or backward pass reaches the first layer's gradient), and on the CPU two
#: more in turn.
_PARAMETERS = 4


def record_path(directory: str, rank: int) -> str:
    """The file of rank ``rank``'s record in ``directory``."""
    return os.path.join(directory, f"devrng-flight.rank{rank}.jsonl")


def new_key() -> str:
    """A fresh key for one save: 64 bits from the OS, never from a generator the run uses."""
    return os.urandom(8).hex()


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


def tell(message: str, log: Callable[[str], None] | None = None) -> None:
    """Say ``message`` (a verdict that is not a warning) as ``devrng._base.errors.say`` does:
    on the ``"devrng"`` logger when logging is set up to show its info lines, else on
    standard error; and on ``log`` (a trainer's logger) too."""
    say(f"devrng flight record: {message}.", log)


class FlightRecord:
    """The flight record of one process of a training run: a line per optimizer step.

    ``TrainingRNG(..., flight_record=DIR)`` and the trainer integrations make one
    (``rng.flight``); it is not made directly. ``rng.flight.loss(loss)`` adds a loss to
    the line of its step; after a resume, ``verified`` says whether the steps the
    interrupted run recorded past the checkpoint matched, and ``verdict`` is what the
    record concluded as a value (the first difference, with its step and part; or the
    steps verified and what was compared), which its warning and log line say. See the resume page for what a
    line holds.

    Args:
        directory: Where the file goes (made if missing).
        rank: This process's rank (one file per rank).
        identity: The run's description (seed, rank, world size), as plain data: a record
            of another rank or world size is not compared step by step.
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
        self.rank = rank
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
        self._backward = False  # a backward pass reached a watched parameter in this step
        # The last step's line, written when the next step begins (so that a loss given
        # after ``opt.step()`` still joins it) and at the latest when that step ends.
        self._held: dict[str, Any] | None = None
        # The interrupted run's steps to compare, each with its generator names.
        self._expected: dict[int, tuple[dict[str, Any], list[str]]] = {}
        self._verified: tuple[int, int] | None = None  # (first, last) step to compare
        self._compared: dict[str, int] = {}  # how many compared steps compared each part
        self._diverged = False
        #: What the record concluded of a resume (``devrng._checks.verdict.Verdict``: the
        #: difference found, or the steps verified and what was compared), or None.
        self.verdict: Verdict | None = None
        #: A load-time warning already said that the resumed run differs (and why): a
        #: difference found then is said as that warning's, not warned of again.
        self.warned_at_load = False
        self._last_checkpoint: int | None = None
        self._stop_after = _int_variable(STOP_VARIABLE)
        self._max_steps = _int_variable(MAX_STEPS_VARIABLE)
        self._ops_at = _int_variable(OPS_VARIABLE)  # the step whose ops to record, if any
        self._ops: Any = None  # the op recorder while it records
        self._watched: dict[str, Watched] = {}
        self._model_hooks: list[Any] = []
        self._models: list[weakref.ref[torch.nn.Module]] = []  # (names for an op recording)
        self._grad_hooked: set[int] = set()  # ids of the optimizers whose backward is seen
        self._views = Views()  # the parameters' sampled elements, found once
        self._done: int | None = None  # the step a "done" line was written at
        self._write({"k": "run", "v": _FORMAT, "a": self.attempt, "id": self.identity,
                     "pid": self._pid})
        ref = weakref.ref(self)
        self._optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._hook = register_optimizer_step_post_hook(
            lambda optimizer, *_: _step_ended(ref, optimizer))
        _open.add(self)
        self._record_ops()

    # -- what a step started from and consumed ----------------------------------------------
    def watch(self, name: str, loader: Any) -> None:
        """See the batches ``loader`` (a ``torch.utils.data.DataLoader``, or a trainer's or
        device's loader feeding from one) delivers; a loader watched already is left as it is."""
        loader = feeding_loader(loader)
        # accelerate's prepared loaders iterate a DataLoader they keep (base_dataloader).
        loader = vars(loader).get("base_dataloader", loader) if hasattr(loader, "__dict__") \
            else loader
        if isinstance(loader, torch.utils.data.DataLoader) \
                and "_devrng_flight" not in loader.__dict__:  # (not watched by another record)
            # Another loader of the same name (a trainer's for a resumed epoch, or a reloaded
            # one) is watched beside the first, under that name.
            key = name if name not in self._watched else f"{name}#{len(self._watched)}"
            self._watched[key] = Watched(self, name, loader)

    def begin_step(self) -> None:
        """The step under way starts now (its generators' fingerprints are taken now)."""
        with self._lock, self._aside():
            if self._start is not None:
                return
            self._write_held()
            if self._stopping():
                self._stop("stop", f"{STOP_VARIABLE}={self._stop_after}")
            self._start = self._fingerprints()

    def consume(self, batch: Any, *, loader: str | None = None) -> None:
        """The step takes ``batch`` (a trainer integration's hook says which): its content is
        digested as the step sees it, and its indices are those of the oldest batch a
        watched loader (``loader``, or any) delivered and no step took yet."""
        with self._lock, self._aside():
            self.begin_step()
            delivered = None
            for name in [loader] if loader is not None else list(self._watched):
                watched = self._watched.get(name)  # type: ignore[arg-type]
                if watched is not None and watched.delivered:
                    delivered = watched.delivered.popleft()
                    break
            indices, _, position, name = delivered or (None, None, None, "")
            self._batches.append((indices, batch_digest(batch), position, name))

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
        self.name_modules(module)

    def name_modules(self, module: torch.nn.Module) -> None:
        """Name modules by their qualified names in ``module`` where the record names one
        (``devrng check-determinism``'s op recording): for a trainer that calls a
        submodule's forward, not the model's."""
        self._models.append(weakref.ref(module))
        if self._ops is not None:  # (recording since before the model was given)
            self._ops.name_modules(module)

    def loss(self, value: Any) -> None:
        """Add a loss (a float or a one-element tensor, read when the line is written: no host
        synchronisation per step) to the line of its step.

        Its step is the one under way once that step has begun (it took a batch from a
        tracked loader, or a backward pass reached the optimizer's parameters), else the step
        that just ended: ``opt.step(); rng.flight.loss(loss)`` and ``loss.backward();
        rng.flight.loss(loss); opt.step()`` both give a step its own loss. A loss tensor given
        before its backward pass joins the step that backward pass belongs to.
        """
        with self._lock:
            if isinstance(value, torch.Tensor):
                tensor = value
                if tensor.numel() != 1:
                    raise ValueError(f"flight.loss takes one number, not a tensor of shape "
                                     f"{tuple(tensor.shape)}.")
                value = tensor.detach()
                value = value if value.dim() == 0 else value.reshape(())
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                tensor, value = None, float(value)
            else:
                raise TypeError(f"flight.loss takes a number or a one-element tensor, not "
                                f"{short_repr(value)}.")
            if self._held is None or self._begun():
                self._losses.append(value)
                return
            losses = self._held.setdefault("l", [])
            losses.append(value)
            if tensor is not None and tensor.requires_grad and not self.hooked \
                    and not self._watched:
                # Given before its backward pass in a loop that takes no tracked batch (with
                # one, the batch would have begun the step): the backward pass says it is the
                # next step's.
                ref, held = weakref.ref(self), self._held
                tensor.register_hook(  # type: ignore[no-untyped-call]
                    functools.partial(_loss_backward, ref, held, value))
            elif self._last_compared(self._held):
                self._write_held()  # the verdict now, not when the next step begins

    def _last_compared(self, line: Mapping[str, Any]) -> bool:
        """Whether ``line`` is the last step a resume compares (its verdict is due)."""
        return len(self._expected) == 1 and line.get("s") in self._expected

    def _begun(self) -> bool:
        return self._start is not None or bool(self._batches) or self._backward

    def _backward_seen(self) -> None:
        """A backward pass reached a parameter of a watched optimizer: the next step is under
        way (the last step's line is written now)."""
        if os.getpid() == self._pid and not self._backward:
            with self._lock:
                self._backward = True
                self._write_held()

    def end_step(self, optimizer: Any = None) -> None:
        """An optimizer stepped: the step under way ends (the optimizer hook calls this with
        the optimizer, whose parameters are digested now)."""
        if os.getpid() != self._pid:
            return
        with self._lock, self._aside():
            if self._start is None:  # no batch came from a tracked loader: fingerprints now
                self.begin_step()
            self._write_held()
            self.step += 1
            line: dict[str, Any] = {"s": self.step, "a": self.attempt, "g": self._start}
            if self._batches:
                indices = [b[0] for b in self._batches]
                line["n"] = len(self._batches)
                line["b"] = [b[1] for b in self._batches]
                line["i"] = None if None in indices else indices_digest(indices)
                first = self._batches[0]
                line["p"] = [first[3], first[2]]
                # What a verdict needs to name the cause: a loader whose workers handed over
                # batches as they finished them (in_order=False), and batches read at the
                # model's input (watch_model), after the training loop had them.
                if any(getattr(self._watched.get(b[3]), "unordered", False)
                       for b in self._batches):
                    line["u"] = 1
                if self._model_hooks:
                    line["m"] = 1
            if self._losses:
                line["l"] = self._losses
            if optimizer is not None:
                digest = self._parameters(optimizer)
                if digest is not None:
                    line["w"] = digest
            self._start, self._batches, self._losses, self._backward = None, [], [], False
            self._held = line
            if self._last_compared(line) and (
                    "l" in line or self._expected[self.step][0].get("l") is None):
                self._write_held()  # the verdict now (a loss to come would join it: it did)
            self._record_ops()
            if self._max_steps is not None and self.step >= self._max_steps:
                self._stop("end", f"{MAX_STEPS_VARIABLE}={self._max_steps}")

    def _parameters(self, optimizer: Any) -> Any:
        """A sampled digest of ``optimizer``'s parameters as the step left them (the first,
        the last and two more in turn), or None when they cannot be read."""
        # The chosen ones are found group by group: a step pays for the optimizer's groups,
        # not for each of a large model's parameters.
        groups = [group.get("params", ()) for group in getattr(optimizer, "param_groups", ())]
        try:
            n = sum(map(len, groups))
            if not n:
                return None
            if id(optimizer) not in self._grad_hooked:
                self._see_backward(optimizer, [p for params in groups for p in params])
            turns = range(_PARAMETERS - 2) if _nth(groups, 0).device.type == "cpu" else ()
            # (On a device, the same two each step: a compiler that traces the step, as XLA's,
            # then sees one graph, not one per choice.)
            chosen = sorted({0, n - 1, *((self.step * 2 + k) % n for k in turns)})
            # (A sharded parameter, a DTensor, is digested as this rank's shard.)
            return self._views.digest([_local(_nth(groups, i)) for i in chosen])
        except Exception:  # a parameter of a kind the digest cannot read: not compared
            return None

    def _see_backward(self, optimizer: Any, params: list[torch.Tensor]) -> None:
        """Be told when a backward pass reaches ``optimizer``'s last parameter (the first to
        get its gradient, usually): one hook, one call a backward pass."""
        self._grad_hooked.add(id(optimizer))
        ref = weakref.ref(self)
        for p in reversed(params):
            if p.requires_grad and p.is_leaf:
                with contextlib.suppress(Exception):  # (a tensor kind without the hook)
                    p.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                        lambda _p: _call(ref, FlightRecord._backward_seen))
                return

    # -- checkpoints and resumes ------------------------------------------------------------
    def checkpoint(self, key: str) -> None:
        """A checkpoint holds the state whose save drew ``key`` (``new_key``): note it with
        this step, so that a run resumed from it finds where it was, and whose it was."""
        with self._lock:
            self._write_held()
            self._write({"k": "ckpt", "a": self.attempt, "s": self.step, "key": key})
            self._last_checkpoint = self.step
            self._file_op(self._sync_and_prune)

    def resume(self, key: str | None, *, step: int | None = None) -> None:
        """This run continues from the checkpoint whose save drew ``key`` (None: a checkpoint
        saved without one): count steps from its step, and compare the coming steps with
        those the attempt that wrote it recorded after it.

        ``step`` is the checkpoint's step when the caller knows it (a trainer's global step).
        """
        with self._lock:
            self._write_held()  # a step taken before the load is this attempt's own
            where = os.path.dirname(self.path)
            try:
                lines, torn = read_lines(self.path)
            except OSError as err:
                self.step = step if step is not None else self.step
                self._say(f"this resume cannot be verified: {self.path} cannot be read "
                          f"({err.strerror or err})")
                return
            found = find_checkpoint(lines, key) if key else None
            if found is None:
                self.step = step if step is not None else self.step
                self._say("this resume cannot be verified: " + not_found(lines, key, where))
                return
            index, attempt, saved_step = found
            self.step = saved_step
            self._readers = None  # what this run has to fingerprint, asked now
            header = header_of(lines, attempt)
            self._write({"k": "from", "a": self.attempt, "from": attempt, "s": saved_step})
            other = identity_problem(header.get("id") if header else None, self.identity)
            if other:
                self._say(f"the steps after the checkpoint (step {saved_step:,}) are not "
                          f"compared with the run that wrote it: {other}")
                return
            expected = steps_after(lines, index, attempt)
            if not expected:
                self._say(f"this resume cannot be verified: "
                          f"{nothing_after(lines, index, attempt, saved_step, _KEEP_CHECKPOINTS)}"
                          + damaged(torn))
                return
            self._expected = expected
            self._compared = {}
            self._verified = (saved_step + 1, max(expected))

    @property
    def verified(self) -> bool | None:
        """After a resume: True once every step the interrupted run recorded past the
        checkpoint matched, False if one differed, None while undecided or not compared.
        A step is compared when its line is written: when the next step begins, at a
        checkpoint, at ``finish()``, and when this is read."""
        with self._lock:
            self._write_held()
        if self._diverged:
            return False
        if self._verified is not None and not self._expected and self._verified[0] <= self.step:
            return True
        return None

    # -- the file -------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the last step's line now (it is written when the next step begins)."""
        with self._lock:
            self._write_held()

    def _write_held(self) -> None:
        """Write the held step's line (reading its device digests and losses now) and compare
        it with the interrupted run's."""
        line, self._held = self._held, None
        if line is None or os.getpid() != self._pid:
            return
        with self._aside():
            if _pending(line):  # digests or fingerprints left on a device: read now, together
                line = resolve(line)
            if "l" in line:  # losses left on a device: read now, with the digests
                line["l"] = [float(v).hex() for v in line["l"]]
        names = list(line["g"])
        if names != self._names:
            self._names = names
            self._write({"k": "names", "a": self.attempt, "names": names})
        compact = dict(line, g=[line["g"][n] for n in names])
        for part in ("b", "w"):
            if isinstance(compact.get(part), list):
                compact[part] = _combine(compact[part])
            elif part in compact:
                compact[part] = str(compact[part])
        self._write(compact)
        self._compare(compact, names)

    def finish(self) -> None:
        """The run is done training (a trainer's end, or the process's): write what is left,
        and say how far a resume was verified if the run ended before the steps that the
        interrupted run recorded past the checkpoint."""
        with self._lock:
            self._write_held()
            if self._done != self.step:  # a run that ended here, as opposed to one killed
                self._done = self.step
                self._write({"k": "done", "a": self.attempt, "s": self.step})
            if not self._expected or self._diverged or self._verified is None:
                return
            first, last = self._verified
            self._expected.clear()
            if self.step >= first:
                compared = compared_text(self._compared, self._compared.get("steps", 0))
                self._say(f"resume verified for steps {first:,} to {self.step:,} (compared: "
                          f"{compared}); the run ended there, before steps {self.step + 1:,} to "
                          f"{last:,}, which the interrupted run recorded")
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
            self._views.clear()
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
        """Drop the steps no resume from the last checkpoints needs, once the file is large.
        Every checkpoint line stays: a resume from an older one is then told why it cannot
        be verified, rather than that the record is another run's."""
        if os.path.getsize(self.path) < PRUNE_BYTES:
            return
        lines, _ = read_lines(self.path)
        checkpoints = [i for i, line in enumerate(lines) if line.get("k") == "ckpt"]
        if len(checkpoints) <= _KEEP_CHECKPOINTS:
            return
        cut = checkpoints[-_KEEP_CHECKPOINTS]
        kept = lines[cut:]
        attempts = dict.fromkeys(line.get("a") for line in kept)
        before = [line for line in lines[:cut] if line.get("k") in ("ckpt", "from")
                  or (line.get("k") == "run" and line.get("a") in attempts)]
        names = {}  # the names in force for each attempt where the kept lines begin
        for line in lines[:cut]:
            if line.get("k") == "names":
                names[line.get("a")] = line
        text = "".join(encode_line(line) for line in [*before, *names.values(), *kept])
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        atomic_write(self.path, lambda fh: fh.write(text.encode()))

    # -- comparing -------------------------------------------------------------------------------
    def _compare(self, line: Mapping[str, Any], names: list[str]) -> None:
        expected = self._expected.pop(line["s"], None)
        if expected is None or self._diverged:
            return
        found = difference(expected[0], expected[1], line, names)
        if found is not None:
            self._diverged = True
            self._expected.clear()
            self.verdict = Verdict(False, "the resumed run differs from the interrupted one",
                                   difference=found)
            first = self._verified[0] if self._verified is not None else line["s"]
            before = (f" Steps {first:,} to {line['s'] - 1:,} matched." if line["s"] > first
                      else " It is the first step after the checkpoint.")
            if self.warned_at_load:  # the cause was named at load: no second, other cause
                self._say(f"the resumed run differs from the interrupted one from {found.where}, "
                          f"as warned when it loaded.{before.rstrip('.')}")
                return
            message = f"devrng flight record: {self.verdict}.{before}"
            warn_and_log(message, stacklevel=2)
            if self.log is not None:
                self.log(message)
            return
        self._compared["steps"] = self._compared.get("steps", 0) + 1
        for part in compared_parts(expected[0], line):
            self._compared[part] = self._compared.get(part, 0) + 1
        if not self._expected and self._verified is not None:
            first, last = self._verified
            count = self._compared["steps"]
            steps = (f"steps {first:,} to {last:,}" if count == last - first + 1 else
                     f"the {count:,} steps from {first:,} to {last:,} that the interrupted run's "
                     "record holds")
            compared = compared_text(self._compared, count)
            self.verdict = Verdict(True, "resume verified", steps=(first, last),
                                   compared=compared)
            self._say(f"resume verified: {steps} drew, consumed and computed exactly what the "
                      f"interrupted run did (compared: {compared})")

    def _say(self, message: str) -> None:
        tell(message, self.log)

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

    def _aside(self) -> contextlib.AbstractContextManager[None]:
        """Where the record's own work (its digests) is not recorded as the step's ops."""
        return self._ops.aside() if self._ops is not None else contextlib.nullcontext()

    # -- the ops of one step (devrng check-determinism) -------------------------------------------
    def _record_ops(self) -> None:
        """Record every op of step ``DEVRNG_RECORD_OPS`` from the end of the step before it
        (from the start of the run for step 1), and keep them beside the record."""
        if self._ops_at is None:
            return
        if self._ops is None and self.step == self._ops_at - 1:
            models = [m for m in (ref() for ref in self._models) if m is not None]
            self._ops = Ops(models).__enter__()
        elif self._ops is not None and self.step >= self._ops_at:
            ops, self._ops = self._ops, None
            ops.__exit__(None, None, None)
            self._file_op(lambda: write_ops(ops_path(os.path.dirname(self.path), self.rank),
                                            ops.ops))

    # -- stopping (devrng check-resume) -------------------------------------------------------------
    def _stopping(self) -> bool:
        return (self._stop_after is not None and self._last_checkpoint is not None
                and self._last_checkpoint >= self._stop_after)

    def _stop(self, kind: str, why: str) -> None:
        """End the process now, as a killed job ends (no clean-up), after the record is
        written: what ``devrng check-resume`` asked for."""
        self._write_held()
        self._write({"k": kind, "a": self.attempt, "s": self.step})
        self._file_op(lambda: os.fsync(self._fd) if self._fd is not None else None)
        _logger.info("devrng flight record: ending the process after step %d (%s).",
                     self.step, why)
        os._exit(0)




def _call(ref: weakref.ref[FlightRecord], method: Callable[[FlightRecord], None]) -> None:
    record = ref()
    if record is not None:
        method(record)


def _loss_backward(ref: weakref.ref[FlightRecord], held: dict[str, Any], value: Any,
                   grad: Any) -> None:
    """A loss given before its backward pass: the backward pass shows it is the step under
    way's, not the held one's (which is written now, without it)."""
    record = ref()
    if record is None or os.getpid() != record._pid:
        return
    with record._lock:
        if record._held is held:
            losses = held.get("l", [])
            if any(v is value for v in losses):
                held["l"] = [v for v in losses if v is not value] or None
                if held["l"] is None:
                    del held["l"]
                record._losses.append(value)
            record._backward_seen()


def _step_ended(ref: weakref.ref[FlightRecord], optimizer: Any) -> None:
    record = ref()
    if record is not None and (not record._optimizers or optimizer in record._optimizers):
        record.end_step(optimizer)


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


def _nth(groups: list[Any], index: int) -> Any:
    """The parameter at ``index`` of an optimizer's groups' parameters, counted across groups."""
    for params in groups:
        if index < len(params):
            return params[index]
        index -= len(params)
    raise IndexError(index)


def _local(param: Any) -> Any:
    """``param``, or this rank's shard of it (a DTensor's)."""
    to_local = getattr(param, "to_local", None)
    return param if to_local is None else to_local()


def _pending(line: Mapping[str, Any]) -> bool:
    """Whether a step's line holds a digest or fingerprint not read from its device yet."""
    for part in (line["g"].values(), line.get("b", ()), (line.get("w"),)):
        for value in part:
            if isinstance(value, Pending):
                return True
    return False


def _combine(digests: list[str]) -> str:
    return digests[0] if len(digests) == 1 else \
        hashlib.blake2b("".join(digests).encode(), digest_size=8).hexdigest()

"""``RNGStreams``: named, independent RNG streams on every device type.

A device-aware take on Megatron-LM's CUDA RNG tracker: each stream keeps its
own state for the CPU generator and for every device it has been forked on
(CUDA, XPU, MPS, XLA, torchax, ...) -- an ``RNGState`` without Python and
NumPy -- swapped in while the stream is forked.

The generators a fork swaps are one per process, shared by every thread: two threads
forking at once would each draw the other's numbers. So forks take turns (``_TURN``): a
thread's fork waits until every fork another thread holds has exited, while forks in one
thread nest as before.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from devrng._backends import host
from devrng._backends.registry import Backend, device_count
from devrng._base.errors import DevRNGError, short_repr, warn_and_log
from devrng._base.locks import ForkSafeLock
from devrng._base.rank import process_rank, world_size
from devrng._base.seeds import check_seed
from devrng._base.sigint import deliver, deliver_waiting, guard
from devrng._generators.plan import Plan, make_plan
from devrng._generators.ranks.protocol import (
    Apply,
    Loader,
    Summary,
    is_ranked,
    load_ranked,
    ranked,
    ranks_text,
    stamp,
)
from devrng._generators.saved import (
    SavedForm,
    check_plain,
    check_saved,
    encode,
    read_saved,
    recorded_counts,
    refusing,
    seal,
)
from devrng._generators.snapshot import RNGState, parse_state, prepare_restore, snapshot
from devrng._generators.undo import Undo, read_devices

__all__ = ["RNGStreams"]

F = TypeVar("F", bound=Callable[..., Any])

# 2: sealed, with the rank that saved it; 1 (devrng <= 0.4) loads unchecked
_FORM = SavedForm("devrng.RNGStreams", (1, 2), 2, "RNGStreams.load_state_dict",
                  "RNGStreams.state_dict()")


def _stream_seed(name: str, seed: int) -> int:
    """The generator seed of stream ``name``: mixed with the name, so that a
    stream never replays the default stream seeded with the same number, nor
    another stream added with the same seed."""
    digest = hashlib.sha256(f"devrng.RNGStreams\0{name}\0{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


class _Stream:
    __slots__ = ("seed", "state")

    def __init__(self, seed: int, state: RNGState) -> None:
        self.seed = seed
        self.state = state  # CPU and device states; replaced, never changed in place

    def advance(self, state: RNGState) -> None:
        """Keep ``state``'s CPU and device states, and this stream's other devices."""
        devices = {t: dict(per) for t, per in self.state.devices.items()}
        for name, per in state.devices.items():
            devices.setdefault(name, {}).update(per)
        self.state = RNGState(state.cpu, devices)


class RNGStreams:
    """Named RNG streams, independent of each other and of the default stream.

    ``add(name, seed)`` creates a stream; ``with streams.fork(name):`` swaps
    its state in for the CPU and every covered device type (as ``fork_rng``
    chooses them from ``devices`` / ``device_type``), keeps the advanced state
    on exit and gives the caller back its own.
    ``state_dict()`` / ``load_state_dict()`` carry every stream across a
    checkpoint in plain data that ``torch.load(weights_only=True)`` reads.

    Examples:
        >>> streams = devrng.RNGStreams()
        >>> streams.add("dropout", 1234)
        >>> before = torch.get_rng_state()
        >>> with streams.fork("dropout", devices=[torch.ones(4)]):
        ...     y = torch.nn.functional.dropout(torch.ones(4), 0.1)
        >>> torch.equal(before, torch.get_rng_state())   # the default stream is untouched
        True
    """

    def __init__(self) -> None:
        """No streams yet: ``add`` names and seeds each."""
        self._streams: dict[str, _Stream] = {}
        self._active: set[str] = set()

    # -- streams ---------------------------------------------------------------
    def add(self, name: str, seed: int) -> None:
        """Create stream ``name`` from ``seed``; a name can be added once.

        Args:
            name: A non-empty string.
            seed: An int in ``[0, 2**64)``; the stream's generators are seeded
                from it and ``name``, so it never replays the default stream
                seeded with the same number.

        Raises:
            TypeError: ``name`` is not a non-empty string, or ``seed`` not an int.
            ValueError: ``name`` was added before, or ``seed`` is out of range.

        Examples:
            >>> streams = devrng.RNGStreams()
            >>> streams.add("model-parallel", devrng.distributed.rank_seed(1234, rank=0))
            >>> streams.names
            ('model-parallel',)
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"A stream name must be a non-empty string, not {short_repr(name)} "
                            f"(a {type(name).__name__}).")
        seed = check_seed(seed)
        if name in self._streams:
            raise ValueError(
                f"A stream named {short_repr(name)} already exists (seed "
                f"{self._streams[name].seed}); "
                "choose another name, or load_state_dict() to replace every stream."
            )
        cpu = torch.Generator().manual_seed(_stream_seed(name, seed)).get_state()
        self._streams[name] = _Stream(seed, RNGState(cpu, {}))

    @property
    def names(self) -> tuple[str, ...]:
        """The streams' names, in the order they were added."""
        return tuple(self._streams)

    def seed(self, name: str) -> int:
        """The seed stream ``name`` was added with."""
        return self._get(name, "seed").seed

    def __contains__(self, name: object) -> bool:
        return name in self._streams

    def __len__(self) -> int:
        return len(self._streams)

    def __repr__(self) -> str:
        inner = ", ".join(f"{n!r}: seed {s.seed}" for n, s in self._streams.items())
        return f"RNGStreams({{{inner}}})"

    def _get(self, name: str, caller: str) -> _Stream:
        stream = self._streams.get(name)
        if stream is None:
            known = ", ".join(repr(n) for n in self._streams) or "none yet"
            raise ValueError(
                f"RNGStreams.{caller}: there is no stream named {name!r}; the streams are: "
                f"{known}. Create it first with streams.add({name!r}, seed)."
            )
        return stream

    # -- forking -----------------------------------------------------------------
    def _materialise(self, name: str, stream: _Stream, plan: Plan) -> None:
        """Give the stream a state on each planned device it has never been forked on."""
        for backend, indices in plan:
            have = stream.state.devices.get(backend.name, {})
            missing = [i for i in indices if i not in have]
            if not missing:
                continue
            # Backends seed all their devices at once; save and put back every one,
            # so that the caller's streams on other devices are left as they were.
            undo = Undo(f"RNGStreams.fork({name!r})")
            undo.save_devices(read_devices([(backend, range(device_count(backend)))]))
            fresh = undo.around(_seed_and_read, backend, _stream_seed(name, stream.seed),
                                missing)
            stream.advance(RNGState(stream.state.cpu, {backend.name: dict(fresh)}))

    def fork(self, name: str, devices: Any = None, *, device_type: Any = None) -> StreamFork:
        """Draw from stream ``name`` inside the block; the caller's state comes back on exit.

        Covers the CPU and the device types of ``devices`` / ``device_type``
        (with neither, the accelerator and XLA / torchax when in use, as
        ``fork_rng``). The stream's advanced state is kept, so the next
        ``fork(name)`` continues where this one stopped. Forks in different threads
        take turns (the generators are one per process): one waits while another
        thread's fork is open, so each thread draws exactly its own streams' numbers.

        Args:
            name: A stream added with ``RNGStreams.add``.
            devices: The devices to cover, as in ``fork_rng``.
            device_type: A device type or a sequence of them, as in ``fork_rng``.

        Returns:
            A context manager. A Ctrl-C that lands in its entry or exit is raised
            once the swap is complete, so the stream is never left half swapped in.

        Raises:
            ValueError: No stream is named ``name``.
            RuntimeError: The stream is already forked (inside itself).

        Examples:
            >>> streams = devrng.RNGStreams()
            >>> streams.add("dropout", 7)
            >>> with streams.fork("dropout", devices=[]):   # the CPU only
            ...     first = torch.rand(4)
            >>> with streams.fork("dropout", devices=[]):   # continues the stream
            ...     second = torch.rand(4)
            >>> torch.equal(first, second)
            False

            On an XLA device (needs torch_xla):

            >>> import torch_xla
            >>> streams = devrng.RNGStreams()
            >>> streams.add("dropout", 7)
            >>> with streams.fork("dropout", devices=["xla:0"]):
            ...     first = torch.rand(4, device="xla:0").cpu()
            >>> with streams.fork("dropout", devices=["xla:0"]):   # continues the stream
            ...     second = torch.rand(4, device="xla:0").cpu()
            >>> torch.equal(first, second)
            False
        """
        return StreamFork(self, name, devices, device_type)

    # -- checkpoints ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every stream's seed and states, under a key that names this process's rank.

        ``{"devrng_rank_<r>": bytes}``: the bytes are what ``torch.save`` makes
        of a dict of plain data (``torch.load(io.BytesIO(b), weights_only=True)``
        reads it), with the identity of this save. The rank in the key keeps
        every rank's streams apart in a ``torch.distributed.checkpoint`` save; in
        a job of several processes every process calls this, as ``dcp.save``
        does (the ranks agree on the save's identity: one small ``all_reduce``).

        Examples:
            >>> streams = devrng.RNGStreams()
            >>> streams.add("dropout", 7)
            >>> torch.save({"rng": streams.state_dict()}, "ckpt.pt")
        """
        streams = {}
        for name, s in self._streams.items():
            devices = {t: dict(per) for t, per in s.state.devices.items() if per}
            check_plain(devices, f"stream {name!r}'s device states")
            streams[name] = {"seed": s.seed, "cpu": s.state.cpu.clone(), "devices": devices}
        return ranked(encode(seal(stamp({"format": _FORM.tag, "version": _FORM.version,
                                         "streams": streams, "world_size": world_size(),
                                         "rank": process_rank()}, self))))

    @guard
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Replace every stream with those ``RNGStreams.state_dict`` saved.

        The whole state is checked first, each stream's states as fully as
        ``set_rng_state`` checks a snapshot against this process; on any
        problem nothing changes. In a job of several processes every process
        calls this (as ``torch.distributed.checkpoint.load`` does) and all of
        them load or all of them raise. There, if this object already has
        streams, the saved ones must have the same names and seeds (a rank
        given another rank's streams after the world or the mesh changed is
        refused), and a job with more ranks than the one that saved continues
        only streams that every saved rank held alike.

        Args:
            state_dict: What ``RNGStreams.state_dict`` returned, or the dict that
                devrng 0.1 saved.

        Raises:
            DevRNGError: ``state_dict`` is not such a dict, a part is malformed,
                it was changed after it was saved (its digest), or (in a job of
                several processes) the state of some rank does not fit (the message
                names the rank).
            RuntimeError: A stream is forked right now.

        Examples:
            >>> saved = devrng.RNGStreams()
            >>> saved.add("dropout", 7)
            >>> streams = devrng.RNGStreams()
            >>> streams.load_state_dict(saved.state_dict())
            >>> streams.seed("dropout")
            7
        """
        try:
            if self._active:
                raise RuntimeError(
                    f"RNGStreams.load_state_dict was called while stream(s) "
                    f"{', '.join(map(repr, sorted(self._active)))} are forked; load it outside "
                    "fork()."
                )
            if is_ranked(state_dict):
                load_ranked(state_dict, self, Loader(
                    _FORM.what, functools.partial(read_saved, form=_FORM), ("streams",),
                    self._prepare))
            else:
                with refusing(_FORM.what):
                    loaded = _read_streams(state_dict, check_saved(state_dict, _FORM))
                self._streams = loaded
        finally:
            deliver()

    def _prepare(self, plain: Any, summary: Summary) -> tuple[Apply, str | None]:
        """Check one rank's streams in a load of all ranks; the change to make."""
        what = "RNGStreams.load_state_dict"
        here = {name: s.seed for name, s in self._streams.items()}
        if summary.borrowed and not here and not summary.uniform:
            raise DevRNGError(
                f"{what}: this job has {summary.world} ranks and the checkpoint holds the "
                f"streams of {summary.missing[0] if summary.missing else '?'}, which differ from "
                "rank to rank, so devrng cannot tell which of them "
                f"{ranks_text(*summary.missing or (summary.rank, summary.rank))} should "
                "continue. Add this rank's streams (names and seeds) before loading, and the "
                "saved streams of the rank at its place in the saved layout are taken if they "
                "are the same; or add the streams afresh instead of loading them.")
        try:
            loaded = _read_streams(plain, plain["version"])  # checked whole when read
        except DevRNGError as err:
            raise DevRNGError(f"{what}: {err}") from None
        saved = {name: s.seed for name, s in loaded.items()}
        if here and here != saved:
            source = (f"rank {summary.source}'s entry" if summary.borrowed
                      else f"the entry of rank {summary.rank}")
            raise DevRNGError(
                f"{what}: this rank's streams are {_names(here)} and {source} holds "
                f"{_names(saved)}: it was saved by a rank that held other streams (another "
                "layout of the ranks, or another run). Add the streams as the saved run did, "
                "or load into an RNGStreams without streams to take whatever was saved.")

        def apply(undo: Undo) -> None:
            undo.push("the streams", setattr, self, "_streams", self._streams)
            self._streams = loaded

        return apply, None


def _names(seeds: Mapping[str, int]) -> str:
    return ", ".join(f"{n!r} (seed {s})" for n, s in seeds.items()) or "none"


def _read_streams(state_dict: Mapping[str, Any], version: int) -> dict[str, _Stream]:
    """The streams a plain state of ``version`` holds (checked whole: ``check_saved``),
    each checked against this process (``DevRNGError``)."""
    raw = state_dict.get("streams")
    if not isinstance(raw, Mapping):
        raise DevRNGError("The RNGStreams state dict has no 'streams' mapping.")
    if version >= 2 and recorded_counts(state_dict, _FORM.what)[1] < 0:
        raise DevRNGError("The RNGStreams state dict does not record the rank that saved it.")
    loaded: dict[str, _Stream] = {}
    for name, entry in raw.items():
        if not isinstance(name, str) or not name:
            raise DevRNGError(f"The RNGStreams state dict names a stream {short_repr(name)}; "
                              "stream names are non-empty strings.")
        shown = short_repr(name)
        if not isinstance(entry, Mapping) or not {"seed", "cpu", "devices"} <= set(entry):
            got = (f"the keys {', '.join(sorted(map(short_repr, entry)))}"
                   if isinstance(entry, Mapping) else short_repr(entry))
            raise DevRNGError(
                f"Stream {shown} in the RNGStreams state dict is malformed: it is {got}, and "
                "a stream is a dict of 'seed' (an int in [0, 2**64)), 'cpu' and 'devices'.")
        try:
            seed = check_seed(entry["seed"], f"stream {shown}'s seed")
        except (TypeError, ValueError) as err:
            raise DevRNGError(f"The RNGStreams state dict is malformed: {err}") from None
        try:
            state = parse_state(entry["cpu"], entry["devices"])
        except (ValueError, DevRNGError) as err:
            raise DevRNGError(
                f"Stream {shown}'s {str(err).removeprefix('its ')}; load what "
                "RNGStreams.state_dict() returned."
            ) from None
        prepare_restore(state)  # device types, counts and state layouts of this process
        loaded[name] = _Stream(seed, RNGState(state.cpu.clone(), state.devices))
    return loaded


def _seed_and_read(backend: Backend, seed: int, indices: list[int]) -> list[tuple[int, Any]]:
    backend.manual_seed(seed)
    return [(i, backend.get_rng_state(i)) for i in indices]


def _swap_in(name: str, stream: _Stream, plan: Plan) -> None:
    """Set the stream's states on the CPU and the planned devices (the caller puts its own
    back if this fails)."""
    label = "cpu"
    try:
        for backend, indices in plan:
            for index in indices:
                label = f"{backend.name}:{index}"
                backend.set_rng_state(stream.state.devices[backend.name][index], index)
        label = "cpu"
        host.set_cpu_state(stream.state.cpu)
    except Exception as err:
        raise DevRNGError(
            f"RNGStreams.fork({name!r}) could not put the stream's {label} state in place "
            f"({type(err).__name__}: {err}); the state was probably loaded from a checkpoint "
            "taken with another torch or device. Every generator was put back."
        ) from err


# Forks of every RNGStreams in this process, one thread's at a time (reentrant: one thread's
# forks nest). _HOLDER lists the holding thread's open turns, outermost first, for the
# warning a fork gives when it has waited _PATIENCE seconds (a block that waits for another
# thread's fork would wait for good).
_TURN = ForkSafeLock()
_HOLDER: list[_Turn] = []
_PATIENCE = 10.0
_POLL = 0.05  # seconds between looks at a Ctrl-C noted while waiting


class _Turn:
    """One fork's hold of ``_TURN``, taken once and given back once.

    ``held`` changes only in the line that acquires or releases the lock, so an exception
    landing between any two lines (devrng's interrupt tests inject one before every line)
    leaves it true exactly while the lock is held, and ``give_back`` can be called again.
    """

    __slots__ = ("held", "who")

    def __init__(self, name: str) -> None:
        self.who = f"thread {threading.current_thread().name!r}'s fork of {name!r}"
        self.held = False

    def take(self) -> None:
        """Wait for the turn (inside a guarded call: a Ctrl-C while waiting is raised here,
        with nothing held)."""
        since = time.monotonic()
        warned = False
        while not self.held:
            self.held = _TURN.acquire(timeout=_POLL)
            if not self.held:
                deliver_waiting()
                if not warned and time.monotonic() - since >= _PATIENCE:
                    warned = True
                    self._warn()
        _HOLDER.append(self)

    def _warn(self) -> None:
        holder = next(iter(_HOLDER[:1]), None)  # (a copy: the holder may change it meanwhile)
        warn_and_log(
            f"RNGStreams.fork: {self.who} has waited {_PATIENCE:g} s for "
            f"{holder.who if holder else 'another thread'} to exit: the generators are one per "
            "process, so forks in different threads take turns. If that fork waits for this "
            "thread, neither will go on; exit it first.", stacklevel=5)

    def give_back(self) -> None:
        if self.held:
            if self in _HOLDER:
                _HOLDER.remove(self)
            self.held = _TURN.release()  # False, in the line that releases


class StreamFork:
    """``RNGStreams.fork(name)``: the stream's states in, the caller's kept aside; on exit the
    stream keeps what it drew and the caller gets its own states back."""

    __slots__ = ("_advanced", "_caller", "_device_type", "_devices", "_name", "_plan", "_stream",
                 "_streams", "_turn")

    def __init__(self, streams: RNGStreams, name: str, devices: Any, device_type: Any) -> None:
        self._streams, self._name = streams, name
        self._devices, self._device_type = devices, device_type

    @guard
    def __enter__(self) -> None:
        turn = _Turn(self._name)
        swapping = False  # the stream's states are (maybe partly) in place: undo them
        try:
            turn.take()  # waits while another thread has a fork open
            streams, name = self._streams, self._name
            stream = streams._get(name, "fork")
            if name in streams._active:
                raise RuntimeError(
                    f"RNGStreams.fork({name!r}) is already active; forking the same stream "
                    "inside itself would replay its numbers. Use it once, or add a second stream."
                )
            plan = make_plan(self._devices, self._device_type, caller="RNGStreams.fork")
            streams._materialise(name, stream, plan)
            caller = Undo(f"RNGStreams.fork({name!r})", wrap=False)
            caller.save_cpu()
            caller.save_devices(read_devices(plan))
            self._stream, self._plan, self._caller = stream, plan, caller
            self._advanced: RNGState | None = None  # what the stream drew, read on exit
            self._turn = turn
            deliver()  # nothing is swapped in yet: a noted Ctrl-C gives back the turn only
            swapping = True
            streams._active.add(name)
            _swap_in(name, stream, plan)
            deliver()  # a Ctrl-C noted meanwhile: the block is not entered, so undo below
        except BaseException as err:
            if swapping:
                caller.roll_back(err)  # the error goes on; what could not be put back is a note
                streams._active.discard(name)
            turn.give_back()
            deliver()
            raise

    @guard
    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        # The caller's states are put back on every way out, also when an interrupt lands
        # here (every line is inside the try); the stream keeps what it drew.
        try:
            self._advanced = snapshot(read_devices(self._plan), python=False, numpy=False)
            if exc is None:
                self._caller.run()
            else:
                self._caller.roll_back(exc)
            self._end()
            self._turn.give_back()
        except BaseException as err:
            if self._advanced is None:
                self._advanced = snapshot(read_devices(self._plan), python=False, numpy=False)
            self._caller.roll_back(err)
            self._end()
            self._turn.give_back()
            raise
        finally:
            self._turn.give_back()  # if an interrupt cut the one above short (it gives once)
            deliver()

    def _end(self) -> None:
        self._streams._active.discard(self._name)
        if self._advanced is not None:
            self._stream.advance(self._advanced)

    def __call__(self, fn: F) -> F:
        """As a decorator: each call of ``fn`` runs inside a fork of its own."""
        streams, name, devices, device_type = (self._streams, self._name, self._devices,
                                               self._device_type)

        @functools.wraps(fn)
        def forked(*args: Any, **kwargs: Any) -> Any:
            with StreamFork(streams, name, devices, device_type):
                return fn(*args, **kwargs)

        return forked  # type: ignore[return-value]

"""``devrng.portable``: torch's random ops drawing the same numbers on every device.

Inside ``with devrng.portable(seed):`` a ``TorchFunctionMode`` answers torch's
random ops (factories, in-place samplers, dropout, ``nn.init``) from a
Threefry-2x32 stream (``devrng._portable.threefry``): the n-th random op of the stream
draws with the key ``fold_in(key(seed), n)``, element i from counter i of
its row-major index. No device generator is read, so the CPU, CUDA, XLA and
torchax give the same numbers, and a DTensor shard is the slice of the full
draw (``devrng._portable.dtensor``).

A mode, not a dispatch mode, because dynamo traces a ``TorchFunctionMode``'s
handler into the graph: under ``torch.compile`` the stream's state is a small
CPU tensor that the graph reads and advances at run time (one compilation for
every seed and step), and the generator itself is one opaque op
(``devrng::bits``) so that inductor never compiles the generator's unrolled integer ops.

What each op does is a table of small objects, in ``devrng._portable.ops``.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode

from devrng._backends.host import draw_seed
from devrng._base.errors import DevRNGError, check_flags, short_repr, warn_and_log
from devrng._base.lazy import imported, load
from devrng._base.rank import process_rank, world_size
from devrng._base.seeds import MASK64, check_counter, check_seed
from devrng._base.sigint import deliver, guard
from devrng._generators.ranks.protocol import (
    SAVE,
    Apply,
    Loader,
    Summary,
    is_ranked,
    load_ranked,
    ranked,
    stamp,
)
from devrng._generators.saved import (
    SEAL_KEYS,
    SavedForm,
    check_saved,
    recorded_counts,
    refusing,
    seal,
)
from devrng._portable import devices, distributions, ops, threefry
from devrng._portable.ops import ENTRIES, Args, Kwargs, Op, aten_entry, entry_name, redispatch

__all__ = ["FLOAT64_CASTS", "PortableRNG", "TracedStream", "active", "call_stream", "portable"]

if TYPE_CHECKING:
    from devrng._generators.undo import Undo

C = TypeVar("C", bound=Callable[..., Any])


# -- the stream's state ----------------------------------------------------------------------
class _HostStream:
    """Seed and counter in a CPU int64 tensor ``[seed >> 32, seed & M32, counter]``.

    Eager code reads and writes it through a ctypes view (no tensor op per
    draw); compiled code passes the tensor to ``devrng::next_key``, which reads
    and advances it inside the graph, so seed and counter are runtime inputs.
    """

    def __init__(self, seed: int, counter: int = 0) -> None:
        # A real CPU tensor even inside FakeTensorMode or another dispatch mode, or under
        # another default device (a meta tensor has no memory: reading it crashed): its
        # memory is read below. It is only ever changed in place, so that memory stays put.
        with torch._C._DisableTorchDispatch():
            self.state = torch.tensor([seed >> 32, seed & threefry.M32, counter],
                                      dtype=torch.int64, device="cpu")
        self._words = (ctypes.c_int64 * 3).from_address(self.state.data_ptr())

    def get(self) -> tuple[int, int]:
        words = self._words
        return (words[0] << 32) | words[1], words[2]

    def set(self, seed: int, counter: int) -> None:
        words = self._words
        words[0], words[1], words[2] = seed >> 32, seed & threefry.M32, counter

    def next_key(self, device: torch.device) -> threefry.HostKey | torch.Tensor:
        if torch.compiler.is_compiling():
            refusal = devices.row(device).compile_error
            if refusal is not None:
                raise DevRNGError(refusal)
            return threefry.next_key(self.state, device)
        words = self._words
        counter = words[2]
        words[2] = counter + 1
        return threefry.fold_in((words[0], words[1]), counter)


class TracedStream:
    """A stream inside one traced call: the base key is a tensor the graph takes as an
    input (from the call's seed), the counter a Python int the trace fixes (each call
    draws from 0). Used by seeded_jit's openxla compiler."""

    def __init__(self, base_key: torch.Tensor) -> None:
        self.base_key = base_key
        self.counter = 0

    def get(self) -> tuple[int, int]:
        raise DevRNGError("A traced portable stream has no host seed to read.")

    def set(self, seed: int, counter: int) -> None:
        raise DevRNGError("A traced portable stream cannot be loaded.")

    def next_key(self, device: torch.device) -> threefry.HostKey | torch.Tensor:
        n = torch.tensor(self.counter, dtype=torch.int64, device=self.base_key.device)
        self.counter += 1
        return threefry.fold_in_tensor(self.base_key, n).to(device)


# -- the mode -------------------------------------------------------------------------------
class PortableRNG(TorchFunctionMode):
    """A portable random stream: torch's random ops inside it draw the same numbers on every
    device. Made by ``portable``; see there.

    Examples:
        >>> rng = devrng.portable(seed=7)
        >>> with rng:
        ...     a = torch.rand(3)
        >>> rng.seed, rng.counter
        (7, 1)
    """

    def __init__(self, seed: int, strict: bool = True, *, stream: Any = None) -> None:
        """Made by ``devrng.portable(seed, strict=...)``, whose arguments these are."""
        super().__init__()
        self.strict = strict
        self._stream: Any = stream
        if stream is None:
            self._stream = _HostStream(check_seed(seed, "PortableRNG's seed"))
        self._warned: set[str] = set()
        # Per open entry, torch's CPU generator then: its seed and state (see _reseeded); None
        # for the streams of seeded_jit's calls, whose bodies are compiled.
        self._seedings: list[tuple[int, torch.Tensor]] | None = None

    # -- state ---------------------------------------------------------------------------
    @property
    def seed(self) -> int:
        """The stream's seed."""
        return self._stream.get()[0]  # type: ignore[no-any-return]

    @property
    def counter(self) -> int:
        """How many random ops the stream has answered (the next one is number ``counter``)."""
        return self._stream.get()[1]  # type: ignore[no-any-return]

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """The stream's position, for checkpoints, under a key that names this process's rank.

        The rank in the key keeps every rank's stream apart in a
        ``torch.distributed.checkpoint`` save (``dcp.save({"rng": stream})``). In
        a job of several processes every process calls this, as ``dcp.save``
        does: the ranks agree on the save's identity (one small ``all_reduce``).

        Returns:
            ``{"devrng_rank_<r>": {"seed": ..., "counter": ..., "world_size": ...,
            "rank": ..., "save": ...}}``: plain ints (``counter`` random ops answered so far;
            ``save`` the identity of this save, by which a load refuses entries of
            different saves), with a header (``format``, ``version``, the devrng version,
            and a digest of it all that ``load_state_dict`` checks).

        Examples:
            >>> rng = devrng.portable(seed=3)
            >>> with rng:
            ...     _ = torch.randn(2); _ = torch.rand(2)
            >>> entry = rng.state_dict()["devrng_rank_0"]
            >>> entry["seed"], entry["counter"], entry["world_size"]
            (3, 2, 1)
        """
        seed, counter = self._stream.get()
        return ranked(seal(stamp({"format": _FORM.tag, "version": _FORM.version, "seed": seed,
                                  "counter": counter, "world_size": world_size(),
                                  "rank": process_rank()}, self)))

    @guard
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue the stream saved by ``state_dict`` (checked first; nothing changes on error).

        In a job of several processes every process calls this (as
        ``torch.distributed.checkpoint.load`` does) and all of them load or all
        of them raise. There, the saved stream must have this stream's seed (which
        names whose stream a rank holds), and
        a rank of a job with more ranks than the one that saved continues the
        stream of the saved rank at its place (rank modulo the saved number)
        when it has the same seed -- as every rank has for a DTensor's shards:
        a portable stream is a function of seed, counter and position in the
        full tensor, so it then continues exactly on any number of ranks.

        Args:
            state_dict: What ``state_dict()`` returned, or ``{"seed": ...,
                "counter": ...}``.

        Raises:
            DevRNGError: The keys are not those, the seed is not an int in
                ``[0, 2**64)`` or the counter not one in ``[0, 2**63)``, the state
                was changed after it was saved (its digest); or, in a job of several
                processes, the state of some rank does not fit (the message names
                the rank).

        Examples:
            >>> rng = devrng.portable(seed=0)
            >>> rng.load_state_dict({"seed": 3, "counter": 2})
            >>> rng.seed, rng.counter
            (3, 2)
        """
        try:  # guarded: a Ctrl-C never leaves the stream half set
            if is_ranked(state_dict):
                load_ranked(state_dict, self, Loader(_FORM.what, _checked_entry,
                                                     ("seed", "counter"), self._prepare))
            else:
                self._stream.set(*_read_stream(state_dict))
        finally:
            deliver()

    def _prepare(self, plain: Mapping[str, Any], summary: Summary) -> tuple[Apply, str | None]:
        """Check one rank's stream in a load of all ranks; the change to make."""
        what = _FORM.what
        seed, counter = int(plain["seed"]), int(plain["counter"])  # (checked when read)
        if seed != self.seed and summary.world > 1:
            whose = (f"rank {summary.source}'s, at this rank's place in the saved layout, "
                     if summary.borrowed else "")
            raise DevRNGError(
                f"{what}: this stream has seed {self.seed} and the checkpoint's {whose}has seed "
                f"{seed}: another run's stream, or another rank's (the ranks held different "
                "streams and the world or the mesh changed). Make the stream with the saved "
                "seed to continue it, or start it afresh instead of loading it.")

        def apply(undo: Undo) -> None:
            undo.push("the portable stream", self._stream.set, *self._stream.get())
            self._stream.set(seed, counter)

        return apply, None

    def __repr__(self) -> str:
        try:
            seed, counter = self._stream.get()
        except DevRNGError:
            return f"PortableRNG(traced, strict={self.strict})"
        return f"PortableRNG(seed={seed}, counter={counter}, strict={self.strict})"

    def __enter__(self) -> PortableRNG:
        if not _dynamo_lists_our_ops and _DYNAMO_TABLE in sys.modules:
            _teach_dynamo()
        if self._seedings is not None and not torch.compiler.is_compiling():
            generator = torch.default_generator
            self._seedings.append((generator.initial_seed(), generator.get_state()))
        return super().__enter__()  # type: ignore[no-any-return,no-untyped-call]

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        if self._seedings and not torch.compiler.is_compiling() \
                and _reseeded(*self._seedings.pop()) and exc[0] is None:
            warn_and_log(
                f"torch's generator was seeded inside this devrng.portable block (seed "
                f"{self.seed}), by torch.manual_seed or devrng.manual_seed: that seeds "
                "torch's own generators, which the block's random ops do not draw from, so "
                "its draws went on from where they were. To restart the portable draws from "
                "a seed, enter devrng.portable(seed) there instead.", stacklevel=2)

    # -- use as a decorator --------------------------------------------------------------
    def __call__(self, fn: C) -> C:
        """``@devrng.portable(seed)``: every call of ``fn`` runs inside this stream."""
        @functools.wraps(fn)
        def inside(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return inside  # type: ignore[return-value]

    # -- the ops -------------------------------------------------------------------------
    # The plumbing the op handlers (and the DTensor module) draw through; not documented
    # for users, so without docstrings (the API reference shows documented members only).
    def next_key(self, device: torch.device) -> threefry.HostKey | torch.Tensor:
        # The key of the next random op, for a draw on ``device``.
        return self._stream.next_key(device)  # type: ignore[no-any-return]

    def source(self, device: torch.device, counters: torch.Tensor | None = None) -> Any:
        # The next op's numbers on ``device``: the Source its row names (distributions' by default).
        key = self.next_key(device)
        row = devices.row(device)
        if row.source is None:
            return distributions.Source(key, device, counters)
        source = load(row.source, what=f"devrng.portable on {row.name}", extra=row.extra)
        return source(key, device, counters)

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Args = (),
                           kwargs: Kwargs | None = None) -> Any:
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            # Dynamo inlines this for every torch call of the compiled region: reading the
            # tables there would rebuild (and guard) each of their ~80 keys every time.
            name = entry_name(func)
            if not name:
                return func(*args, **kwargs)
            return getattr(ops, name).handle(self, func, types, args, kwargs)
        if not _dynamo_lists_our_ops and _DYNAMO_TABLE in sys.modules:
            _teach_dynamo()  # torch.compile may have been called inside the block
        entry = ENTRIES.get(func)
        if entry is None and isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            entry = aten_entry(func)  # torch.ops.aten.<random op> called directly
        if entry is not None:
            return entry.handle(self, func, types, args, kwargs)
        if "torchax" in sys.modules and (kwargs.get("dtype") is torch.float64
                                         or func in FLOAT64_CASTS):
            # torchax without x64 would make a float64 tensor float32 (refused: see there)
            load("devrng._portable.jax", what="devrng.portable on torchax",
                 extra="torchax").refuse_float64(func, args, kwargs)
        if redispatch is not None and inspect.isfunction(func) \
                and not func.__module__.startswith("torch."):
            # A Python-level torch function of another library: run its body with this
            # mode on, so random ops inside it are answered too. torch's own such functions
            # that draw are in the tables; the others are called directly (faster).
            with self:
                return redispatch(func, types, args, kwargs)
        return func(*args, **kwargs)

    # Refuse a random op the stream does not cover (strict), or warn of it once.
    def refuse(self, name: str, why: str = "") -> None:
        if self.strict:
            raise DevRNGError(
                f"{name} draws random numbers that devrng.portable does not cover{why}; inside "
                "portable(strict=True) it would break the promise of the same numbers on every "
                "device. Pass generator=... to use a torch.Generator of your own, move the call "
                "out of the portable block, or use portable(strict=False) to let it draw from "
                "the device's own generator (with a warning)."
            )
        if name not in self._warned:
            self._warned.add(name)
            warnings.warn(
                f"devrng.portable(strict=False): {name} draws from the device's own generator "
                f"(not covered{why}); its numbers differ between devices.",
                UserWarning, stacklevel=4)


# Tensor methods that make a float64 tensor without dtype=: portable's mode sends them, and
# every call with dtype=torch.float64, to devrng._portable.jax.refuse_float64 under torchax.
FLOAT64_CASTS = frozenset(getattr(torch.Tensor, name) for name in ("to", "double", "type"))

# 2: with a header and a digest; the dicts without one (devrng <= 0.4) load unchecked
_FORM = SavedForm("devrng.PortableRNG", (2,), 2, "PortableRNG.load_state_dict",
                  "PortableRNG.state_dict()")
_KEYS = {"seed", "counter", "world_size", "rank"}
_OLD_KEYS = ({"seed", "counter"}, {"seed", "counter", "world_size"})


def _read_stream(state_dict: Any, source: str | None = None) -> tuple[int, int]:
    """Seed and counter of a saved stream, checked whole (its header and digest where it has
    a header: ``check_saved``; the world size and rank it records); or a ``DevRNGError``
    sentence."""
    with refusing(_FORM.what):
        return _checked_stream(state_dict, source)


def _checked_stream(state_dict: Any, source: str | None) -> tuple[int, int]:
    what = _FORM.what
    keys = set(state_dict) if isinstance(state_dict, Mapping) else None
    if keys is not None and "format" in keys:
        check_saved(state_dict, _FORM, source=source)
        keys -= {"format", "version", SAVE, *SEAL_KEYS}
        expected: Any = (_KEYS,)
    else:
        expected = _OLD_KEYS
    where = f"{what}: {source}" if source else what
    if keys not in expected:
        got = (f"the keys [{', '.join(sorted(map(short_repr, state_dict)))}]"
               if isinstance(state_dict, Mapping) else repr(type(state_dict).__name__))
        raise DevRNGError(
            f"{where} needs what PortableRNG.state_dict() returns ('seed', 'counter', "
            "'world_size' and 'rank' under its header), or a mapping with exactly the keys "
            f"'seed' and 'counter', not {got}.")
    try:
        seed = check_seed(state_dict["seed"], "state_dict['seed']")
        counter = check_counter(state_dict["counter"], "state_dict['counter']")
    except (TypeError, ValueError) as err:
        raise DevRNGError(f"{where}: {err}") from None
    recorded_counts(state_dict, what)  # (checked already under a header)
    return seed, counter


def _checked_entry(entry: Any, source: str) -> Any:
    """One rank's entry, checked whole (``_read_stream``)."""
    _read_stream(entry, source)
    return entry


def portable(seed: int | None = None, *, strict: bool = True) -> PortableRNG:
    """A random stream that gives the same numbers on every device (context manager, decorator).

    Inside it, torch's random ops -- ``rand``, ``randn``, ``randint``,
    ``randperm``, ``bernoulli``, ``normal``, ``uniform_``, ``random_``,
    ``exponential_``, ``multinomial``, dropout and so the ``nn.init``
    functions -- draw from a Threefry-2x32 counter-based stream computed with
    the output device's own integer ops: op number n of the stream uses the
    key ``jax.random.fold_in(jax.random.key(seed), n)`` and element i of a
    draw comes from counter i (its row-major index), as in JAX. The CPU,
    CUDA, XLA and torchax give the same bits; float32 uniforms equal
    ``jax.random.uniform``'s. A call with ``generator=`` uses that generator.
    Another random op raises a ``DevRNGError`` naming it (``strict=True``) or
    draws from the device's generator with a warning (``strict=False``).

    The stream continues across uses of the same object (``state_dict()`` /
    ``load_state_dict()`` save and resume it).

    Args:
        seed: An int in ``[0, 2**64)``; ``None`` draws one from torch's default
            generator now, so ``torch.manual_seed`` at program start makes the
            whole run reproducible.
        strict: Refuse random ops the stream does not cover (``True``), or let
            them draw from the device's generator with a warning (``False``).

    Returns:
        A ``PortableRNG``: use it as ``with stream:`` or ``@stream``.

    Raises:
        TypeError: ``seed`` is not an int, or ``strict`` not a bool.
        ValueError: ``seed`` is outside ``[0, 2**64)``.

    Examples:
        >>> with devrng.portable(seed=0):
        ...     mask = torch.nn.functional.dropout(torch.ones(8), 0.5)
        ...     w = torch.nn.init.kaiming_uniform_(torch.empty(3, 4))
        >>> with devrng.portable(seed=0):
        ...     torch.equal(mask, torch.nn.functional.dropout(torch.ones(8), 0.5))
        True
        >>> with devrng.portable(seed=1):
        ...     torch.rand(3)   # jax.random.uniform(jax.random.fold_in(jax.random.key(1), 0), (3,))
        tensor([0.7026, 0.2348, 0.8179])
    """
    check_flags(strict=strict)
    seed = draw_seed() if seed is None else check_seed(seed, "portable's seed")
    stream = PortableRNG(seed & MASK64, strict)
    stream._seedings = []  # a user's block: a seeding of torch's generator inside it is said
    return stream


def _reseeded(seed: int, state: torch.Tensor) -> bool:
    """Whether torch's CPU generator was seeded since it had ``seed`` and ``state``: another
    seed now, or freshly seeded now (its Mersenne Twister at the position seeding sets) and
    not then. (Seeded again with the seed it had, nothing drawn since, it is as it was: that
    cannot be seen, and changes nothing either.) The position in ``state`` is read only
    when the one now is fresh, and the state now only when the seed is the same."""
    generator = torch.default_generator
    if generator.initial_seed() != seed:
        return True
    if not _FRESH:
        _FRESH.append(_fresh_position())
    fresh = _FRESH[0]
    return fresh is not None and _position(generator.get_state()) == fresh \
        and _position(state) != fresh


def _position(state: torch.Tensor) -> bytes:
    """The bytes of a CPU generator's state that say where its Mersenne Twister stands
    (read at its address: ``.numpy()`` alone would take twice as long)."""
    return ctypes.string_at(state.data_ptr() + _AT.start, _AT.stop - _AT.start)


def _fresh_position() -> bytes | None:
    """The position (``_position``) seeding sets alike for every seed (``left``, ``seeded``,
    ``next`` of torch's legacy layout); None if this torch's layout is another (the check
    then sees only seeds that differ)."""
    a, b = torch.Generator().manual_seed(0), torch.Generator().manual_seed(12345)
    fresh = _position(a.get_state())
    torch.rand(1, generator=b)
    ok = fresh == _position(torch.Generator().manual_seed(9).get_state()) and \
        fresh != _position(b.get_state())
    return fresh if ok else None


_AT = slice(8, 24)
_FRESH: list[bytes | None] = []  # _fresh_position(), read at the first block's exit


_dynamo_lists_our_ops = False  # set once _teach_dynamo has run
_DYNAMO_TABLE = "torch._dynamo.variables.torch"  # imported with dynamo; holds its list


def _teach_dynamo() -> None:
    """Have dynamo hand every function portable covers to torch function modes.

    Dynamo sends a call to the modes only for functions on its own list of
    overridable functions, which lacks ``torch.rand_like`` and ``torch.normal``
    (and, before torch 2.10, every tensor factory): inside ``torch.compile``
    those would draw from the native generator without a word. The list is a
    cached set in dynamo; portable adds its functions to it once dynamo is
    imported (never importing dynamo itself: that takes seconds).
    """
    module = imported(_DYNAMO_TABLE)
    overridable = getattr(module, "get_overridable_functions", None)
    if overridable is None:
        return
    overridable().update(f for f, e in ENTRIES.items() if isinstance(e, Op))
    # Marked here rather than by a decorator, which would import dynamo with devrng.
    torch.compiler.assume_constant_result(entry_name)  # type: ignore[no-untyped-call]
    # Rounds Python numbers with struct, which older dynamo (torch 2.8) cannot trace.
    torch.compiler.assume_constant_result(distributions.round_to)  # type: ignore[no-untyped-call]
    # When a compiled function breaks its graph (at loss.backward(), say), dynamo keeps
    # watching the frames that run eagerly, and would compile this handler as a function
    # of its own, once per argument type. It is only ever meant to be inlined into the
    # caller's graph: run it (and what it calls) as plain Python when it is a frame.
    eval_frame = imported("torch._dynamo.eval_frame")
    types = imported("torch._dynamo.types")
    strategy = getattr(eval_frame, "set_code_exec_strategy", None)
    if strategy is not None and types is not None:
        skip = types.FrameExecStrategy(types.FrameAction.SKIP, types.FrameAction.SKIP)
        strategy(PortableRNG.__torch_function__.__code__, skip)
    global _dynamo_lists_our_ops
    _dynamo_lists_our_ops = True


def call_stream(seed: int, strict: bool, key_device: torch.device | None = None
                ) -> PortableRNG:
    """A fresh stream for one call of a seeded_jit function: the draws of
    ``with portable(seed): fn(...)``. With ``key_device`` the base key is a tensor there
    (runtime data of an XLA graph built by dynamo), else host state."""
    _teach_dynamo()
    if key_device is None:
        return PortableRNG(seed, strict)
    stream = TracedStream(threefry.key_tensor(threefry.seed_key(seed), key_device))
    return PortableRNG(seed, strict, stream=stream)


def active() -> PortableRNG | None:
    """The innermost portable stream of this thread's torch function mode stack, if any."""
    # torch keeps its function modes in C++; these two private calls read the stack
    # without changing it (torch.overrides has no public reader).
    for i in reversed(range(torch._C._len_torch_function_stack())):
        mode = torch._C._get_function_stack_at(i)
        if isinstance(mode, PortableRNG):
            return mode
    return None

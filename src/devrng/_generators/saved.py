"""Saved states: whether one is valid (one owner of every check), and their bytes.

Every state devrng reads back -- a snapshot, a ``TrainingRNG``, ``RNGStreams``
or ``PortableRNG`` checkpoint, a ``seeded_jit`` function's state, a rank's
broadcast -- is checked here before anything changes: its header and its digest
(``check_saved``: every saved form is ``seal``-ed with the devrng version that
wrote it and a SHA-256 of its exact content, so a flipped bit, a partial copy or
an edit is refused, never read as another state); that it is plain data a
weights-only file holds, of plausible size and nesting (``check_loaded``); that
its CPU, Python and NumPy parts would install working generators
(``check_cpu_state`` and its siblings: NumPy does not range-check its MT19937
position, so a large one reads out of bounds on the next draw; Python keeps any
object as its Gaussian cache; torch takes any uint8 tensor of the right size as
a CPU state); and that its device states fit this process's devices
(``fit_devices``, ``check_device_states``). Applying a checked state is the
callers' part (``Restore`` in ``devrng._generators.snapshot``, an ``Undo``).

Saved states travel as the bytes ``torch.save`` makes of them (``encode``) and are
read back weights-only and bounded (``decode``). What a saved state is in a job of
several ranks -- one entry per rank, the identity of a save, loading all ranks
together -- is ``devrng._generators.ranks``.
"""

from __future__ import annotations

import hashlib
import io
import math
import random
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch

from devrng._backends import host as _host
from devrng._backends.registry import (
    Backend,
    available_backends,
    device_count,
    get_backend,
    started_types,
)
from devrng._base.errors import DevRNGError, short_repr
from devrng._base.plain import exact_bytes
from devrng._base.rank import count_problem
from devrng._base.seeds import MASK64
from devrng._base.sigint import deliver, guard
from devrng._base.version import VERSION
from devrng._generators.undo import DeviceState

__all__ = ["DIGEST", "MAX_STATE_BYTES", "SEAL_KEYS", "WRITER", "Fit", "SavedForm",
           "check_cpu_state", "check_depth", "check_device_states", "check_host_parts",
           "check_loaded", "check_numpy_state", "check_plain", "check_python_state",
           "check_saved", "cpu_state_numel", "decode", "describe", "encode", "fit_devices",
           "parse_parts", "read_parts", "read_saved", "recorded_counts", "refusing", "seal",
           "signature"]


# -- what a saved state may hold -------------------------------------------------------------
_PLAIN_LEAVES = (torch.Tensor, bool, int, float, str, type(None))
_PLAIN = (*_PLAIN_LEAVES, list, tuple, dict)
#: No generator state devrng knows is larger (the CPU's is 5 KB, a TPU's seed 8 bytes):
#: a bigger tensor in a loaded file is a mistake or an attack, not a state.
MAX_STATE_BYTES = 1 << 20
#: Lists and dicts in a state nest a few levels deep; a file nesting them deeper is hostile.
MAX_DEPTH = 32


def _walk(state: Any, what: str) -> Iterator[Any]:
    """Every value nested in ``state`` (lists, tuples, dicts), without recursion; a nesting
    deeper than ``MAX_DEPTH`` is refused (no state devrng writes nests more than a few)."""
    stack = [(state, 0)]
    while stack:
        item, depth = stack.pop()
        yield item
        if isinstance(item, (list, tuple, dict)):
            if depth >= MAX_DEPTH:
                raise DevRNGError(
                    f"{what} nests lists and dicts more than {MAX_DEPTH} deep; devrng's states "
                    "nest a few levels, so this was not written by devrng."
                )
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def check_depth(state: Any, what: str) -> None:
    """Raise ``DevRNGError`` if ``state`` nests more than ``MAX_DEPTH`` deep."""
    for _ in _walk(state, what):
        pass


def check_plain(state: Any, what: str) -> None:
    """Raise ``DevRNGError`` unless ``state`` is tensors, numbers, strings, lists and dicts."""
    for item in _walk(state, what):
        if not isinstance(item, _PLAIN):
            raise DevRNGError(
                f"{what} is a {type(item).__name__}, which a weights-only file cannot hold; its "
                "backend must return tensors, numbers, strings, lists or dicts."
            )


def check_loaded(state: Any, what: str) -> None:
    """``check_plain``, and every tensor a compact, plausibly sized state.

    A file can hold a tensor that claims 10**12 elements over a few bytes of
    storage (stride 0): comparing or hashing it later would allocate all of
    them. Such tensors are refused when the file is read.
    """
    for item in _walk(state, what):
        if not isinstance(item, _PLAIN):
            check_plain(item, what)  # its sentence
        if isinstance(item, torch.Tensor):
            size = item.numel() * item.element_size()
            if size > MAX_STATE_BYTES or not item.is_contiguous():
                raise DevRNGError(
                    f"{what} holds a tensor of shape {tuple(item.shape)} "
                    + ("that is not laid out contiguously" if size <= MAX_STATE_BYTES
                       else f"({size} bytes)")
                    + f"; generator states are compact tensors of at most {MAX_STATE_BYTES} "
                    "bytes, so this file was not written by devrng."
                )


@contextmanager
def refusing(what: str) -> Iterator[None]:
    """Turn any failure inside but an interrupt into one ``DevRNGError`` sentence: a hostile
    state can fail a check in ways no check foresaw, and a load raises nothing else (in a
    job of several ranks, a rank that raised anything else would leave the others waiting)."""
    try:
        yield
    except DevRNGError:
        raise
    except Exception as err:
        raise DevRNGError(f"{what}: the state is malformed ({type(err).__name__}: "
                          f"{_words(err)}); load what devrng saved.") from err


def _words(err: BaseException) -> str:
    try:
        return short_repr(str(err), 200)
    except Exception:  # an exception whose str() fails too
        return "no message"


# -- the header every saved form carries ---------------------------------------------------------
#: Keys ``seal`` adds to a saved state: the devrng that wrote it, and a digest of all the rest.
WRITER = "devrng_version"
DIGEST = "digest"
SEAL_KEYS = frozenset({WRITER, DIGEST})
_HEX = re.compile(r"[0-9a-f]{64}")


def seal(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` -- a saved state's plain dict, its ``format`` and ``version`` included --
    with the devrng version writing it and a SHA-256 digest of all of that, which
    ``check_saved`` verifies before anything of it is read. Every saved form is sealed
    here, so a key added to a state later is covered without a word about it.

    Examples:
        >>> sorted(seal({"format": "devrng.RNGStreams", "version": 2, "streams": {}}))
        ['devrng_version', 'digest', 'format', 'streams', 'version']
    """
    sealed = {**data, WRITER: VERSION}
    try:
        sealed[DIGEST] = _digest(sealed, _stand_in)
    except ValueError as err:  # a state devrng made holds what it should not: a bug
        raise DevRNGError(f"A {short_repr(data.get('format'))} state cannot be saved: it "
                          f"{err}.") from None
    return sealed


def _digest(data: Mapping[Any, Any], stand_in: Callable[[Mapping[Any, Any]], bytes | None]
            ) -> str:
    """SHA-256 of the exact canonical bytes (``exact_bytes``) of ``data`` without its
    digest, in which a devrng state nested in it (a ``TrainingRNG`` state's snapshot and
    tracked streams) stands as its own digest (``stand_in``): each part is hashed once,
    and ``_verify`` checks the nested digests too. ``ValueError`` for a hostile state."""
    h = hashlib.sha256(b"devrng saved state\0")
    h.update(exact_bytes(data, stand_in=stand_in, max_depth=MAX_DEPTH, leave_out=DIGEST))
    return h.hexdigest()


def _sealed_digest(data: Mapping[Any, Any]) -> Any:
    """The digest of a sealed devrng state (``seal``), or None for any other dict."""
    tag = data.get("format")
    if DIGEST in data and WRITER in data and type(tag) is str and tag.startswith("devrng."):
        return data[DIGEST]
    return None


def _stand_in(data: Mapping[Any, Any]) -> bytes | None:
    digest = _sealed_digest(data)
    return None if digest is None else b"D" + exact_bytes(digest, max_depth=0)


class SavedForm(NamedTuple):
    """One saved form: the header ``check_saved`` reads it by, and the words of its errors.

    Examples:
        >>> form = SavedForm("devrng.RNGState", (1, 2), 2, "RNGState", "RNGState.to_dict()")
        >>> form.version                     # the one this devrng writes
        2
    """

    tag: str  #: its format tag (``"devrng.TrainingRNG"``)
    versions: tuple[int, ...]  #: the versions this devrng reads, the one it writes last
    sealed_since: int  #: the first version that carries a digest (``seal``)
    what: str  #: what reads it, for messages (``"TrainingRNG.load_state_dict"``)
    made_by: str  #: what writes it, for messages (``"TrainingRNG.state_dict()"``)
    #: Keys whose values are other objects' states (a ``TrainingRNG``'s tracked objects):
    #: only their nesting is checked here; their owners check the rest.
    own: tuple[str, ...] = ()
    #: Keys whose values map names to ``torch.Generator`` states, each checked here.
    generators: tuple[str, ...] = ()

    @property
    def version(self) -> int:
        """The version this devrng writes."""
        return self.versions[-1]


def check_saved(data: Any, form: SavedForm, *, source: str | None = None,
                covered: bool = False) -> int:
    """The version of a saved state of ``form``, once all of it is checked and before any
    of it is read; or one ``DevRNGError`` sentence. Every load of a saved form is checked
    here: its header (format tag and version), the world size and rank it records
    (``recorded_counts``), its nesting and the size of all of it (plain data a weights-only
    file holds: ``check_loaded``; of ``form.own`` only the nesting), its digest (computed
    over checked values only), and last the generator states of ``form.generators``.
    ``source`` names a file or entry ``data`` came from.

    Versions from ``form.sealed_since`` on carry a digest (``seal``) and are refused
    without one; older versions load unchecked, unless they hold a digest (then it is
    verified: a version changed by a flipped bit does not turn the check off).
    ``covered``: ``data`` is part of a state checked whole here, digest and all (a
    snapshot inside a ``TrainingRNG`` state): it carries no digest of its own and is not
    walked again.

    Examples:
        >>> form = SavedForm("devrng.RNGState", (1, 2), 2, "RNGState.from_dict",
        ...                  "RNGState.to_dict()")
        >>> check_saved(seal({"format": "devrng.RNGState", "version": 2}), form)
        2
    """
    version = _check_header(data, form, source)
    recorded_counts(data, form.what)
    where = source or f"{form.what}: the state"
    # Walked (bounded) before it is hashed: the digest is computed over checked values only.
    own = form.own
    if not covered:
        check_loaded({k: v for k, v in data.items() if k not in own} if own else data, where)
        for key in own:
            check_depth(data.get(key), f"{where}'s {key!r}")
    # A part that is wrong is said after the digest: a state changed since it was saved
    # is refused as that, whichever part the change broke.
    problem = next(filter(None, (_generators_problem(data.get(key)) for key in form.generators)),
                   None)
    if not covered and (version >= form.sealed_since or DIGEST in data):
        _verify(data, version, f"{form.what}: {source or 'the state'}")
    if problem is not None:
        raise DevRNGError(f"{form.what}: {problem}.")
    return version


def _generators_problem(saved: Any) -> str | None:
    """What is wrong with the first state of ``saved`` (generator names to CPU generator
    states) that is not one, or None."""
    if not isinstance(saved, Mapping):
        return None  # (its owner says what it lacks)
    for name, state in saved.items():
        try:
            check_cpu_state(state)
        except ValueError as err:
            return (f"the saved state of generator {short_repr(name)} is not a CPU generator "
                    f"state: {str(err).removeprefix('its CPU state ')}")
    return None


def read_saved(payload: Any, source: str, *, form: SavedForm) -> Any:
    """The plain state in ``payload``, the bytes of a saved state of ``form`` (``encode``: a
    rank's entry), read weights-only (``decode``) and checked whole (``check_saved``)."""
    plain = _unpickle(payload, f"{form.what}: {source}")
    check_saved(plain, form, source=source)  # (walks it as decode does)
    return plain


def recorded_counts(data: Mapping[str, Any], what: str) -> tuple[int, int]:
    """The world size and rank a saved state records (-1 where it records none), or one
    ``DevRNGError`` sentence saying what is wrong with one (``count_problem``).

    Examples:
        >>> recorded_counts({"world_size": 2, "rank": 1}, "RNGStreams.load_state_dict")
        (2, 1)
    """
    counts = []
    for key, name, low in (("world_size", "world size", 1), ("rank", "rank", 0)):
        value = data.get(key, -1)
        if key in data and (problem := count_problem(value, low)) is not None:
            raise DevRNGError(f"{what}: the saved {name} {problem}.")
        counts.append(int(value))
    return counts[0], counts[1]


def _check_header(data: Any, form: SavedForm, source: str | None) -> int:
    """The version of a saved state tagged ``form.tag``, or a ``DevRNGError`` sentence naming
    what ``data`` is instead."""
    tag, what, made_by = form.tag, form.what, form.made_by
    tagged = data.get("format") if isinstance(data, Mapping) else None
    if not (type(tagged) is str and tagged == tag):
        got = _not_a_state(data, tag, made_by)
        if source is not None:
            raise DevRNGError(f"{source} is not a valid devrng state for {what}: {got}. Write it "
                              f"with {made_by}.")
        raise DevRNGError(f"{what} takes the dict that {made_by} returns; {got}.")
    version = data.get("version")
    if type(version) is not int or version not in form.versions:
        known = sorted(form.versions)
        raise DevRNGError(f"{what}: {source or 'the state'} is version {short_repr(version)}; "
                          f"this devrng reads version{'s' if len(known) > 1 else ''} "
                          f"{', '.join(map(str, known))}.")
    return version


#: The key prefix of a rank's entry in what a devrng object's ``state_dict()`` returns.
PREFIX = "devrng_rank_"


def _not_a_state(data: Any, tag: str, made_by: str) -> str:
    """What ``data`` is, in words, when it is not a saved state tagged ``tag``: the key that
    holds one in a whole checkpoint, the keys of another dict, or a path not loaded yet."""
    if isinstance(data, Mapping) and "format" not in data:
        holders = [key for key, value in data.items() if isinstance(value, Mapping) and (
            str(value.get("format", "")).startswith("devrng.")
            or any(str(k).startswith(PREFIX) for k in value))]
        if holders:
            return (f"it is a dict that holds a devrng state under the key "
                    f"{short_repr(holders[0])} (a whole checkpoint?): pass that entry, "
                    f"checkpoint[{short_repr(holders[0])}]")
        keys = ", ".join(map(short_repr, list(data)[:8])) + (", ..." if len(data) > 8 else "")
        return f"it is a dict with the keys {keys or '(none)'}, none of which holds a devrng state"
    if isinstance(data, Mapping):
        return f"its format tag is {short_repr(data.get('format'))}, not {tag!r}"
    if isinstance(data, str) or hasattr(data, "__fspath__"):
        return (f"it is the {type(data).__name__} {short_repr(data)}, not a state: to resume "
                "from a file, load it first (torch.load(path, weights_only=True)) and pass what "
                f"{made_by} returned, from inside it")
    return "it is None" if data is None else \
        f"it is {short_repr(data)} (of type {type(data).__name__})"


def _verify(data: Mapping[str, Any], version: int, where: str) -> None:
    """Raise ``DevRNGError`` unless ``data``'s digest is the digest of its content."""
    stored = data.get(DIGEST)
    if not (isinstance(stored, str) and _HEX.fullmatch(stored)):
        problem = ("has no digest, which every state of its version carries" if stored is None
                   else f"holds the digest {short_repr(stored)}, which is not one devrng writes")
        raise DevRNGError(f"{where} {problem}: it was altered or damaged after it was written "
                          f"(version {version}), so none of it is loaded. Load an intact copy.")
    nested: list[Mapping[Any, Any]] = []  # sealed states inside, which stand as their digest
    seen = {id(data)}  # (a file can make a dict hold itself)

    def stand_in(part: Mapping[Any, Any]) -> bytes | None:
        instead = _stand_in(part)
        if instead is not None and id(part) not in seen:
            seen.add(id(part))
            nested.append(part)
        return instead

    try:  # one pass over each part, bounded and checked as it is hashed
        altered = _digest(data, stand_in) != stored
        while nested and not altered:
            part = nested.pop()
            altered = _digest(part, stand_in) != part[DIGEST]
    except ValueError as err:
        raise DevRNGError(f"{where} {err}, so it was not written by devrng.") from None
    except Exception as err:  # a tensor of an exotic dtype or layout a file can still hold
        raise DevRNGError(f"{where} could not be hashed ({type(err).__name__}: "
                          f"{_words(err)}), so it was not written by devrng.") from None
    if altered:
        writer = data.get(WRITER)
        by = f"devrng {writer}" if isinstance(writer, str) and len(writer) < 40 else "devrng"
        raise DevRNGError(
            f"{where} was altered or damaged after {by} wrote it: its content does not match "
            "the SHA-256 digest written with it (a flipped bit on disk or in transfer, a "
            "partial copy, an edit), so none of it is loaded. Load an intact copy.")


def signature(state: Any, depth: int = 0) -> Any:
    """Type, shape and dtype of a state, to compare a saved state with this process's
    (nestings deeper than any state's are cut: ``"..."``)."""
    if isinstance(state, torch.Tensor):
        return ("tensor", state.dtype, tuple(state.shape))
    if isinstance(state, bool):
        return "bool"
    if isinstance(state, int):
        return "int"
    if isinstance(state, (dict, list, tuple)) and depth > MAX_DEPTH:
        return "..."
    if isinstance(state, dict):
        return {k: signature(v, depth + 1) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [signature(v, depth + 1) for v in state]
    return type(state).__name__


def describe(state: Any) -> str:
    """A state's kind in words: ``"a torch.uint8 tensor of shape (5056,)"``, ``"an int"``."""
    if isinstance(state, torch.Tensor):
        return f"a {state.dtype} tensor of shape {tuple(state.shape)}"
    if isinstance(state, bool):
        return "a bool"
    if isinstance(state, int):
        return "an int"
    if isinstance(state, (dict, list, tuple)):
        return f"a {type(state).__name__} shaped {short_repr(signature(state), 120)}"
    return f"a {type(state).__name__}"


# -- the host generators' states -------------------------------------------------------------
_MT_WORDS = 624
_scratch = random.Random(0)  # states are tried here first, never on the global generator
_scratch_cpu = torch.Generator()  # likewise for torch's CPU generator
_cpu_numel: list[int] = []  # the size of this torch's CPU generator state, read once


def check_python_state(state: Any) -> None:
    """Raise ``ValueError`` unless ``random.setstate(state)`` would install a working generator.

    Examples:
        >>> check_python_state(random.getstate())
    """
    if not (isinstance(state, tuple) and len(state) == 3 and state[0] == 3
            and isinstance(state[1], tuple) and len(state[1]) == _MT_WORDS + 1):
        raise ValueError("it is not a tuple (3, 625 ints, gauss) as random.getstate() returns")
    gauss = state[2]
    if gauss is not None and (type(gauss) is not float or not math.isfinite(gauss)):
        raise ValueError(f"its Gaussian cache is {short_repr(gauss)}; it must be a finite float or None")
    if not any(state[1][:_MT_WORDS]):
        raise ValueError("its MT19937 key is all zeros, which generates nothing but zeros")
    try:
        _scratch.setstate(state)  # checks every word and the position
    except (TypeError, ValueError, OverflowError) as err:
        raise ValueError(f"random.setstate refuses it ({err})") from None


def check_numpy_state(state: Any) -> None:
    """Raise ``ValueError`` unless NumPy's global generator can take ``state`` and keep working.

    Examples:
        >>> check_numpy_state(_host.get_numpy_state())
    """
    np = _host.numpy_or_none()
    if np is None:
        raise ValueError("it is a NumPy state and NumPy is not installed here")
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name != "MT19937":
        raise ValueError(f"its bit generator is {short_repr(name)}; NumPy's global generator is 'MT19937'")
    try:
        inner = state["state"]
        key, pos = inner["key"], inner["pos"]
        has_gauss, gauss = state["has_gauss"], state["gauss"]
    except (KeyError, TypeError, IndexError):
        raise ValueError("it is not the dict np.random.get_state(legacy=False) returns") from None
    if not (isinstance(key, np.ndarray) and key.dtype == np.uint32
            and key.shape == (_MT_WORDS,)):
        raise ValueError("its key is not 624 uint32 words")
    if not key.any():
        raise ValueError("its MT19937 key is all zeros, which generates nothing but zeros")
    if type(pos) is not int or not 0 <= pos <= _MT_WORDS:
        raise ValueError(f"its position is {short_repr(pos)}; it must be an int from 0 to 624")
    if has_gauss not in (0, 1) or type(has_gauss) is bool:
        raise ValueError(f"its has_gauss is {short_repr(has_gauss)}; it must be 0 or 1")
    if type(gauss) is not float or not math.isfinite(gauss):
        raise ValueError(f"its Gaussian cache is {short_repr(gauss)}; it must be a finite float")


def cpu_state_numel() -> int:
    """How many bytes this torch's CPU generator state has."""
    if not _cpu_numel:
        _cpu_numel.append(_host.get_cpu_state().numel())
    return _cpu_numel[0]


def check_cpu_state(state: Any) -> None:
    """Raise ``ValueError`` unless ``state`` is a CPU generator state this torch can take.

    Used for the CPU state of snapshots, of streams and of DataLoader generators.

    Examples:
        >>> check_cpu_state(torch.get_rng_state())
    """
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.dim() != 1 \
            or state.numel() != cpu_state_numel() or state.device.type != "cpu":
        raise ValueError(
            f"its CPU state is {describe(state)}; this torch needs a uint8 CPU tensor of "
            f"{cpu_state_numel()} elements"
        )
    try:
        _scratch_cpu.set_state(state)  # checks the MT19937 position and key
    except RuntimeError as err:
        raise ValueError(f"its CPU state is not a valid MT19937 state ({err})") from None


def _python_from_plain(raw: Any) -> tuple[int, tuple[int, ...], float | None]:
    if not isinstance(raw, (list, tuple)) or len(raw) != 3:
        raise ValueError("its Python state is not [version, key tensor, gauss]")
    version, internal, gauss = raw
    if not isinstance(internal, torch.Tensor) or internal.dtype != torch.int64 \
            or tuple(internal.shape) != (625,):
        raise ValueError(f"its Python key is {describe(internal)}, not 625 int64 values")
    state = (version, tuple(internal.tolist()), gauss)
    try:
        check_python_state(state)
    except ValueError as err:
        raise ValueError(f"its Python state is unusable: {err}") from None
    return state


def _numpy_from_plain(raw: Any) -> dict[str, Any]:
    np = _host.numpy_or_none()
    if np is None:
        raise ValueError("it holds a NumPy state and NumPy is not installed here")
    if not isinstance(raw, Mapping):
        raise ValueError("its NumPy state is not a dict")
    key = raw["key"]
    if not isinstance(key, torch.Tensor) or key.dtype != torch.int64 \
            or tuple(key.shape) != (624,):
        raise ValueError(f"its NumPy key is {describe(key)}, not 624 int64 values")
    words = key.numpy()  # (NumPy's reductions: a fraction of the cost of torch's on 624 words)
    if words.min() < 0 or words.max() > 0xFFFFFFFF:
        raise ValueError("its NumPy key holds values outside [0, 2**32)")
    state = {"bit_generator": raw["bit_generator"],
             "state": {"key": words.astype(np.uint32), "pos": raw["pos"]},
             "has_gauss": raw["has_gauss"], "gauss": raw["gauss"]}
    try:
        check_numpy_state(state)
    except ValueError as err:
        raise ValueError(f"its NumPy state is unusable: {err}") from None
    return state


def parse_parts(cpu: Any, devices: Any, python: Any = None, numpy: Any = None
                ) -> tuple[torch.Tensor, dict[str, dict[int, Any]], Any, Any]:
    """The parts of a snapshot from the plain data ``RNGState.to_dict`` writes, each checked as
    far as this process can without touching a generator; ``ValueError`` saying what is wrong
    ("its CPU state ..."). Snapshots and ``RNGStreams`` checkpoints are read with it."""
    check_cpu_state(cpu)
    if not isinstance(devices, Mapping):
        raise ValueError("its 'devices' entry is not a dict")
    parsed: dict[str, dict[int, Any]] = {}
    for name, per in devices.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"it names the device type {short_repr(name)}")
        if not isinstance(per, Mapping):
            raise ValueError(f"its {name} entry is not a dict of device index to state")
        parsed[name] = {}
        for index, saved in per.items():
            if type(index) is not int or index < 0:
                raise ValueError(f"it names the {name} device index {short_repr(index)}")
            check_loaded(saved, f"its {name}:{index} state")
            parsed[name][index] = saved
    return (cpu, parsed, None if python is None else _python_from_plain(python),
            None if numpy is None else _numpy_from_plain(numpy))


def read_parts(data: Any, form: SavedForm, *, source: str, covered: bool = False
               ) -> tuple[torch.Tensor, dict[str, dict[int, Any]], Any, Any]:
    """The parts of a saved snapshot (``RNGState.to_dict``'s data of ``form``), once all of it
    is checked in one call: the whole (``check_saved``; ``covered``: it is part of a state whose
    digest was verified), then each part (``parse_parts``)."""
    check_saved(data, form, source=source, covered=covered)
    return parse_parts(data["cpu"], data["devices"], data["python"], data["numpy"])


def check_host_parts(cpu: Any, python: Any, numpy: Any) -> None:
    """Raise ``DevRNGError`` unless a snapshot's CPU, Python and NumPy states (the last two
    may be None) would install working generators: a snapshot built by hand is checked as
    fully as one that ``parse_parts`` read."""
    try:
        check_cpu_state(cpu)
    except ValueError as err:
        raise DevRNGError(f"The snapshot's {str(err).removeprefix('its ')}.") from None
    checks = (("Python", "random.setstate accepts", check_python_state, python),
              ("NumPy", "NumPy's global generator can take", check_numpy_state, numpy))
    for label, accepts, check, part in checks:
        if part is not None:
            try:
                check(part)
            except ValueError as err:
                raise DevRNGError(
                    f"The snapshot's {label} state is not one that {accepts}: {err}."
                ) from None


# -- device states against this process -------------------------------------------------------
class Fit(NamedTuple):
    """What of a saved state fits this process's devices (see ``fit_devices``)."""

    devices: dict[str, dict[int, Any]]  # the device states to restore
    skipped: list[str]  # what is not restored, as phrases
    reseed: tuple[Backend, ...]  # backends with devices the state holds no state for
    seed: int  # ... seeded with this


def fit_devices(devices: Mapping[str, Mapping[int, Any]], *, strict: bool, seed: int) -> Fit:
    """The device states of a saved state (``devices``) this process has devices for, and what does not fit:
    devices it lacks (left out), and devices or started types the state lacks (to seed
    with ``seed``). With ``strict``, the first misfit raises ``ValueError`` saying what it
    is."""
    kept: dict[str, dict[int, Any]] = {}
    skipped: list[str] = []
    reseed: list[Backend] = []
    here = {name: get_backend(name) for name in available_backends()} if devices else {}
    for name, per in devices.items():
        backend = here.get(name)
        count = 0 if backend is None else device_count(backend)
        fits = {i: s for i, s in per.items() if i < count}
        lost = sorted(set(per) - set(fits))
        if lost and strict:
            raise ValueError(f"the state holds {name} devices {lost}, and this process has "
                             f"{count} {name} device(s)")
        if lost:
            skipped.append(f"{name} devices {lost} (this process has {count})")
        if fits:
            kept[name] = fits
        if backend is not None and len(fits) < count:
            if strict:
                raise ValueError(f"this process has {count} {name} device(s), and the state "
                                 f"holds {len(fits)}")
            reseed.append(backend)
            skipped.append(f"{name} devices {sorted(set(range(count)) - set(fits))} "
                           "(none saved: seeded from the seed and this rank)")
    for name in started_types():
        if name in devices:
            continue
        if strict:
            raise ValueError(f"this process uses {name} devices, and the state holds none")
        reseed.append(get_backend(name))
        skipped.append(f"{name} devices (none saved: seeded from the seed and this rank)")
    return Fit(kept, skipped, tuple(reseed), seed)


def check_device_states(devices: Mapping[str, Mapping[int, Any]]) -> list[DeviceState]:
    """``(backend, index, state)`` for every saved device state, once each is checked against
    this process (it has the device type and the device; the state has the type, shape and
    dtype of its own); ``DevRNGError`` on the first that does not fit, before any change."""
    targets: list[DeviceState] = []
    for name, per in devices.items():
        try:
            backend = get_backend(name)
        except (ValueError, ImportError) as err:
            raise DevRNGError(
                f"The snapshot holds {name} states, but this process cannot reach {name} devices "
                f"({err})."
            ) from err
        count = device_count(backend) if backend.is_available() else 0
        for index, saved in per.items():
            if not 0 <= index < count:
                raise DevRNGError(
                    f"The snapshot holds a state for {name}:{index}, but this process has "
                    + (f"{count} {name} device(s); restore it where that device exists."
                       if count else f"no {name} device; restore it where one exists.")
                )
            _check_device_state(backend.name, index, saved, backend.get_rng_state, "snapshot")
            targets.append((backend, index, saved))
    return targets


def _check_device_state(name: str, index: int, saved: Any, read: Any, whose: str) -> None:
    """A saved device state must have the type, shape and dtype of this process's own."""
    try:
        current = read(index)
    except Exception as err:
        raise DevRNGError(
            f"Restoring the {whose} failed before changing anything: reading this process's "
            f"{name}:{index} state raised {type(err).__name__}: {err}."
        ) from err
    if signature(saved) != signature(current):
        raise DevRNGError(
            f"The {whose}'s {name}:{index} state is {describe(saved)}, but this process's is "
            f"{describe(current)}; it was taken with another backend or library version."
        )
    if type(saved) is int and not 0 <= saved <= MASK64:
        raise DevRNGError(f"The {whose}'s {name}:{index} state is {saved}, outside [0, 2**64).")


# -- a saved state as bytes ---------------------------------------------------------------
@guard
def encode(plain: Any) -> bytes:
    """The bytes ``torch.save`` makes of ``plain`` (read back by ``decode``).

    Guarded: a Ctrl-C raised inside ``torch.save`` can be lost there (11 of 10,000 real
    interrupts in ``TrainingRNG.state_dict`` before this was guarded); noted, it is raised
    once the bytes are made.
    """
    try:
        buffer = io.BytesIO()
        torch.save(plain, buffer)
        return buffer.getvalue()
    finally:
        deliver()


def decode(payload: Any, what: str) -> Any:
    """What ``encode`` made ``payload`` from, read weights-only and checked as a state file is."""
    plain = _unpickle(payload, what)
    check_loaded(plain, what)
    return plain


def _unpickle(payload: Any, what: str) -> Any:
    """``decode`` without the walk of what it read: for a caller that checks it whole."""
    if not isinstance(payload, (bytes, bytearray)):
        raise DevRNGError(f"{what} is {short_repr(payload)} (a {type(payload).__name__}), not "
                          "the bytes devrng saves there.")
    try:
        plain = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as err:
        first = (str(err).splitlines() or [""])[0][:200]
        raise DevRNGError(f"{what} could not be read ({type(err).__name__}: {first}); it is "
                          "corrupt or was not written by devrng.") from None
    return plain

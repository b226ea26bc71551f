"""Fuzzing every saved form devrng writes, in a child process: ``python -m tests._fuzz N SEED``.

Each form -- a snapshot file and its dict, a ``TrainingRNG`` entry and its plain dict, an
``RNGStreams`` entry and dict, a portable stream's entry and dict, a ``SeededFunction``'s state,
and entries moved between ranks -- is saved once, then loaded ``N`` times changed: bits flipped
anywhere (a quarter of them in the CPU generator's bytes), bytes overwritten, files cut short or
extended, runs of zeros, values replaced with hostile ones (deep nests, tensors where a dict
belongs, huge ints, objects whose ``repr`` raises), keys dropped, added or renamed, and the digest
itself changed. Some changed dicts are sealed again (``resealed``) or written in the unsealed
form of devrng 0.4, to reach the checks behind the digest.

Every load must end one way: refused with a ``DevRNGError`` sentence that changed nothing, or
accepted leaving exactly the state the intact input gives. An input that kept the digest it was
saved with (every changed file, and dicts not sealed again) is never accepted as another state;
a sealed-again or unsealed one may be (it is what a user wrote), and the generators must work
after it. The child prints one JSON line: per form, the counts of each outcome and a few
examples of every failure (``raw``: another exception; ``changed``: another state accepted;
``half``: refused after changing something; ``mute``: a message that is not a sentence).
"""

from __future__ import annotations

import io
import json
import os
import random
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tests._helpers import generator_states, plain_state, resealed, unsealed

import devrng

Load = Callable[[Any], None]


class Form:
    """One saved form: its intact input, how to load an input, what it leaves, how to move
    the state away before a load (so that a load that does nothing is seen)."""

    def __init__(self, name: str, intact: Any, load: Load, state: Callable[[], Any],
                 perturb: Callable[[], None], mutate: Callable[[random.Random, Any],
                                                           tuple[Any, bool, str]],
                 *, sets_host: bool) -> None:
        self.name, self.intact, self.load, self.state = name, intact, load, state
        self.perturb, self.mutate = perturb, mutate
        self.sets_host = sets_host  # whether a load sets the host generators (else: never)
        load(intact)
        self.expected = state()


# ----------------------------------------------------------------------------- changes to bytes
def change_bytes(r: random.Random, data: bytes, hot: tuple[int, int]) -> tuple[bytes, str]:
    """``data`` changed one way; ``hot`` is the span of the CPU generator's bytes in it."""
    out = bytearray(data)
    kind = r.choice(["flip", "flip", "flip_hot", "flips", "byte", "cut", "extend", "zeros"])
    if kind in ("flip", "flip_hot"):
        low, high = hot if kind == "flip_hot" else (0, len(out))
        at = r.randrange(low, high)
        out[at] ^= 1 << r.randrange(8)
    elif kind == "flips":
        for _ in range(r.randint(2, 8)):
            out[r.randrange(len(out))] ^= 1 << r.randrange(8)
    elif kind == "byte":
        out[r.randrange(len(out))] = r.randrange(256)
    elif kind == "cut":
        del out[r.randrange(len(out)):]
    elif kind == "extend":
        out += bytes(r.randrange(256) for _ in range(r.randint(1, 64)))
    else:
        at = r.randrange(len(out))
        out[at:at + r.randint(1, 512)] = bytes(min(512, len(out) - at))
    return bytes(out), kind


def _span(data: bytes, part: torch.Tensor) -> tuple[int, int]:
    raw = bytes(part.numpy().tobytes())
    at = data.find(raw)
    assert at >= 0, "the CPU generator's bytes are not stored as they are"
    return at, at + len(raw)


# ----------------------------------------------------------------------------- changes to dicts
class Evil:
    """A value whose every method a message could call raises."""

    def __repr__(self) -> str:
        raise RuntimeError("repr of Evil")

    def __index__(self) -> int:
        raise RuntimeError("index of Evil")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq of Evil")

    __hash__ = object.__hash__


def _nest(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def hostile(r: random.Random, old: Any) -> Any:
    """A value that does not belong where ``old`` was."""
    loop: list[Any] = []
    loop.append(loop)
    choices: list[Callable[[], Any]] = [
        lambda: None, lambda: True, lambda: -1, lambda: 0, lambda: 2**64, lambda: 2**70,
        lambda: -(2**63), lambda: r.getrandbits(64), lambda: 10**5000, lambda: float("nan"),
        lambda: float("inf"), lambda: 1.5, lambda: "", lambda: "x" * r.randint(1, 3000),
        lambda: b"bytes", lambda: _nest(r.choice([40, 3000])), lambda: loop,
        lambda: torch.zeros(3, dtype=torch.uint8), lambda: torch.ones(624, dtype=torch.int64),
        lambda: torch.zeros(5056, dtype=torch.uint8), lambda: torch.zeros(10**6),
        lambda: torch.zeros(1).expand(10**9), lambda: torch.tensor(1), lambda: [1, 2],
        lambda: {"a": 1}, lambda: {0: None}, lambda: (1, 2), lambda: Evil(),
        lambda: {"seed": Evil(), "counter": 0}, lambda: [old, old],
    ]
    return r.choice(choices)()


def _paths(state: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if depth < 6 and isinstance(state, dict):
        for k, v in state.items():
            out += _paths(v, (*prefix, k), depth + 1)
    elif depth < 6 and isinstance(state, list):
        for i, v in enumerate(state):
            out += _paths(v, (*prefix, i), depth + 1)
    return out


def _get(state: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        state = state[key]
    return state


def _replaced(state: Any, path: tuple[Any, ...], change: Callable[[Any, Any], Any]) -> Any:
    """A copy of ``state`` with the containers along ``path`` copied and ``change(container,
    key)`` made to the last one (the rest shared: no deep copies of deep values)."""
    top = dict(state) if isinstance(state, dict) else list(state)
    node = top
    for key in path[:-1]:
        child = node[key]
        node[key] = dict(child) if isinstance(child, dict) else list(child)
        node = node[key]
    change(node, path[-1])
    return top


def _flip_value(r: random.Random, value: Any) -> Any:
    """``value`` with one bit of it flipped (an int, float, string or tensor)."""
    if isinstance(value, torch.Tensor) and value.numel():
        raw = value.clone().contiguous().view(-1).view(torch.uint8)
        at = r.randrange(raw.numel())
        raw[at] ^= 1 << r.randrange(8)
        return raw.view(value.dtype).view(value.shape)
    if type(value) is int:
        return value ^ (1 << r.randrange(max(1, value.bit_length() + 1)))
    if type(value) is float:
        return float(np.frombuffer(np.float64(value).tobytes(), np.uint64)[0]
                     ^ np.uint64(1 << r.randrange(64)))
    if type(value) is str and value:
        at = r.randrange(len(value))
        return value[:at] + chr(ord(value[at]) ^ (1 << r.randrange(7))) + value[at + 1:]
    return hostile(r, value)


def change_dict(r: random.Random, state: dict[str, Any]) -> tuple[Any, str]:
    """``state`` changed one way (a value, a key, the digest); the change's kind."""
    kind = r.choice(["flip", "flip", "flip", "hostile", "hostile", "drop", "add", "rename",
                     "digest"])
    if kind == "digest" and isinstance(state.get("digest"), str):
        return {**state, "digest": _flip_value(r, state["digest"])}, kind
    paths = _paths(state)
    path = r.choice(paths)
    if kind == "flip":
        return _replaced(state, path, lambda c, k: c.__setitem__(k, _flip_value(r, c[k]))), kind
    if kind in ("drop", "rename") and isinstance(_get(state, path[:-1]), dict):
        def drop(c: Any, k: Any) -> None:
            value = c.pop(k)
            if kind == "rename":
                c[_flip_value(r, k) if isinstance(k, (str, int)) else "renamed"] = value
        return _replaced(state, path, drop), kind
    if kind == "add" and isinstance(_get(state, path[:-1]), dict):
        key = r.choice(["extra", 0, 7, "seed", "digest", "rank"])
        return _replaced(state, path, lambda c, k: c.__setitem__(key, hostile(r, None))), kind
    return _replaced(state, path, lambda c, k: c.__setitem__(k, hostile(r, c[k]))), "hostile"


def _sealable(state: Any, depth: int = 0) -> bool:
    """Whether sealing ``state`` again is cheap here: no tensor of over 1 MB or expanded (a
    stride-0 tensor would be hashed element by element), no deep nest."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size() <= 1 << 20 and 0 not in state.stride()
    if isinstance(state, (dict, list, tuple)):
        values = state.values() if isinstance(state, dict) else state
        return depth < 30 and all(_sealable(v, depth + 1) for v in values)
    return True


def dict_changes(older: Callable[[dict[str, Any]], dict[str, Any]] | None
                 ) -> Callable[[random.Random, Any], tuple[Any, bool, str]]:
    """Changes to a sealed dict: as changed (the digest it was saved with: never accepted as
    another state), sealed again, or in the unsealed form of devrng 0.4 (``older``)."""
    def mutate(r: random.Random, intact: Any) -> tuple[Any, bool, str]:
        changed, kind = change_dict(r, intact)
        way = r.random()
        if way < 0.25 and _sealable(changed):
            try:
                return resealed(changed), False, kind + "+resealed"
            except devrng.DevRNGError:  # not plain data: it cannot be sealed
                pass
        if way < 0.45 and older is not None and isinstance(changed, dict):
            return older(changed), False, kind + "+unsealed"
        return changed, True, kind
    return mutate


def _older(version: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda state: unsealed(state, version)


def _bare(*keys: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The dict of devrng 0.4's portable streams and seeded_jit functions: ``keys`` only."""
    return lambda state: {k: v for k, v in state.items() if k in keys or k not in _HEADER}


_HEADER = {"format", "version", "devrng_version", "digest", "world_size", "rank", "seed",
           "counter", "base_seed"}


def byte_changes(hot: tuple[int, int], wrap: Callable[[bytes], Any] = lambda b: b
                 ) -> Callable[[random.Random, Any], tuple[Any, bool, str]]:
    def mutate(r: random.Random, intact: Any) -> tuple[Any, bool, str]:
        raw = intact if isinstance(intact, bytes) else next(iter(intact.values()))
        changed, kind = change_bytes(r, raw, hot)
        return wrap(changed), True, kind
    return mutate


# ----------------------------------------------------------------------------- the forms
def _draw() -> None:
    torch.rand(1)
    random.random()
    np.random.random()


def _snapshot_forms() -> list[Form]:
    snap = devrng.get_rng_state(devices=[])
    buffer = io.BytesIO()
    snap.save(buffer)
    data = buffer.getvalue()
    return [
        Form("snapshot file", data,
             lambda b: devrng.set_rng_state(devrng.RNGState.load(io.BytesIO(b))),
             generator_states, _draw, byte_changes(_span(data, snap.cpu)), sets_host=True),
        Form("snapshot dict", snap.to_dict(),
             lambda d: devrng.set_rng_state(devrng.RNGState.from_dict(d)),
             generator_states, _draw, dict_changes(_older(1)), sets_host=True),
    ]


def _training_rng() -> tuple[devrng.TrainingRNG, Any]:
    rng = devrng.TrainingRNG(seed=5)
    loader = rng.track("loader", torch.utils.data.DataLoader(
        range(16), batch_size=4, shuffle=True, **rng.dataloader_kwargs()))
    step = rng.track("step", devrng.seeded_jit(lambda x: x + torch.rand(1), backend="eager"))
    streams = devrng.RNGStreams()
    streams.add("a", 1)
    rng.track("streams", streams)
    stream = rng.portable()
    rng.track("noise", torch.Generator().manual_seed(3))
    list(loader)
    step(torch.zeros(1))
    with stream:
        torch.rand(2)
    return rng, step


def _training_forms() -> list[Form]:
    rng, step = _training_rng()
    saved = rng.state_dict()
    (entry,) = saved.values()

    def state() -> Any:
        # Exact: every generator, every object; but not the identity every save gets afresh.
        plain = plain_state(rng.state_dict())
        plain.pop("save", None)
        return resealed(plain)["digest"]

    def perturb() -> None:
        _draw()
        step(torch.zeros(1))

    hot = _span(entry, plain_state(saved)["rng"]["cpu"])
    return [
        Form("TrainingRNG entry", saved, lambda sd: rng.load_state_dict(sd), state, perturb,
             byte_changes(hot, lambda b: {"devrng_rank_0": b}), sets_host=True),
        Form("TrainingRNG dict", plain_state(saved), lambda d: rng.load_state_dict(d), state,
             perturb, dict_changes(_older(2)), sets_host=True),
    ]


def _streams_forms() -> list[Form]:
    streams = devrng.RNGStreams()
    streams.add("a", 1)
    streams.add("b", 2)
    with streams.fork("a", devices=[]):
        torch.rand(3)
    saved = streams.state_dict()
    fresh = devrng.RNGStreams()  # the same streams, not advanced: another state
    fresh.add("a", 1)
    fresh.add("b", 2)
    elsewhere = plain_state(fresh.state_dict())  # loaded without a rank: replaces any streams

    def state() -> Any:  # (without the identity every save gets afresh)
        plain = plain_state(streams.state_dict())
        plain.pop("save", None)
        return resealed(plain)["digest"]

    (entry,) = saved.values()
    hot = _span(entry, plain_state(saved)["streams"]["a"]["cpu"])
    return [
        Form("RNGStreams entry", saved, lambda sd: streams.load_state_dict(sd), state,
             lambda: streams.load_state_dict(elsewhere),
             byte_changes(hot, lambda b: {"devrng_rank_0": b}), sets_host=False),
        Form("RNGStreams dict", plain_state(saved), lambda d: streams.load_state_dict(d), state,
             lambda: streams.load_state_dict(elsewhere), dict_changes(_older(1)), sets_host=False),
    ]


def _small_forms(r: random.Random) -> list[Form]:
    stream = devrng.portable(7)
    with stream:
        torch.rand(2)
    saved = stream.state_dict()
    step = devrng.seeded_jit(lambda x: x, backend="eager", seed=3)
    step(torch.zeros(1))

    def portable_state() -> Any:
        return stream.seed, stream.counter

    def move_stream() -> None:
        stream.load_state_dict({"seed": r.getrandbits(64), "counter": r.getrandbits(20)})

    portable_changes = dict_changes(_bare("seed", "counter", "world_size"))

    def ranked_changes(rng: random.Random, intact: Any) -> tuple[Any, bool, str]:
        changed, checked, kind = portable_changes(rng, intact["devrng_rank_0"])
        return {"devrng_rank_0": changed}, checked, kind

    return [
        Form("portable entry", saved, lambda sd: stream.load_state_dict(sd), portable_state,
             move_stream, ranked_changes, sets_host=False),
        Form("portable dict", plain_state(saved), lambda d: stream.load_state_dict(d),
             portable_state, move_stream, portable_changes, sets_host=False),
        Form("SeededFunction", step.state_dict(), lambda d: step.load_state_dict(d),
             lambda: step.state_dict()["digest"],
             lambda: step.load_state_dict({"base_seed": r.getrandbits(64), "counter": 9}),
             dict_changes(_bare("base_seed", "counter")), sets_host=False),
    ]


def _rank_one(make: Callable[[], Any]) -> Any:
    """What ``make()`` saves as rank 1 of 2 (a process started by a launcher)."""
    os.environ.update(RANK="1", WORLD_SIZE="2")
    try:
        return make()
    finally:
        del os.environ["RANK"], os.environ["WORLD_SIZE"]


def swapped_entries() -> list[tuple[str, Callable[[], None]]]:
    """Loads of an entry under another rank's key: each must be refused."""
    rng, _ = _training_rng()
    streams = devrng.RNGStreams()
    streams.add("a", 1)
    stream = devrng.portable(7)
    cases = []
    for name, obj in (("TrainingRNG", rng), ("RNGStreams", streams), ("portable", stream)):
        mine = next(iter(obj.state_dict().values()))
        theirs = next(iter(_rank_one(obj.state_dict).values()))
        for key, entry in (("devrng_rank_0", theirs), ("devrng_rank_1", mine),
                           ("devrng_rank_2", theirs)):
            cases.append((f"{name}: {key} holding another rank's entry",
                          lambda o=obj, k=key, e=entry: o.load_state_dict({k: e})))
    return cases


# ----------------------------------------------------------------------------- the run
def _exercise() -> None:
    """Every host generator draws (a state accepted must leave working generators)."""
    torch.rand(3)
    random.random()
    random.gauss(0, 1)
    np.random.random(3)
    np.random.normal()


def attempt(form: Form, value: Any, checked: bool) -> str:
    form.perturb()
    before, host = form.state(), generator_states()
    try:
        form.load(value)
    except devrng.DevRNGError as err:
        if form.state() != before or generator_states() != host:
            return "half"
        text = str(err)
        return "refused" if text.endswith((".", ".)")) and len(text) < 4000 else "mute"
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:
        return "raw"
    if not form.sets_host and generator_states() != host:
        return "changed"  # a stream, a counter: never the host generators
    if form.state() == form.expected:
        return "same"
    _exercise()
    return "changed" if checked else "accepted"


def run(count: int, seed: int) -> dict[str, Any]:
    r = random.Random(seed)
    forms = _snapshot_forms() + _training_forms() + _streams_forms() + _small_forms(r)
    report: dict[str, Any] = {}
    for form in forms:
        started = time.perf_counter()
        tally: Counter[str] = Counter()
        examples: dict[str, list[str]] = {}
        for _ in range(count):
            value, checked, kind = form.mutate(r, form.intact)
            outcome = attempt(form, value, checked)
            tally[outcome] += 1
            tally[f"{kind}:{outcome}"] += 1
            if outcome in ("raw", "changed", "half", "mute"):
                try:
                    form.load(value)
                except BaseException as err:  # the failure's own words and place, to report
                    where = traceback.extract_tb(err.__traceback__)[-3:]
                    detail = (f"{type(err).__name__}: {str(err)[:300]} at "
                              + " < ".join(f"{os.path.basename(f.filename)}:{f.lineno}"
                                           for f in reversed(where)))
                else:
                    detail = "accepted"
                examples.setdefault(outcome, []).append(f"{kind}: {detail}")
        report[form.name] = {"inputs": count, "tally": dict(tally),
                             "seconds": round(time.perf_counter() - started, 1),
                             "examples": {k: v[:5] for k, v in examples.items()}}
    swaps = Counter()
    for name, load in swapped_entries():
        try:
            load()
        except devrng.DevRNGError:
            swaps["refused"] += 1
        except BaseException as err:
            swaps[f"raw {name}: {type(err).__name__}"] += 1
        else:
            swaps[f"accepted {name}"] += 1
    report["swapped entries"] = {"inputs": sum(swaps.values()), "tally": dict(swaps),
                                 "examples": {}}
    return report


if __name__ == "__main__":
    warnings.simplefilter("ignore")  # resumes that warn are outcomes like any other
    torch.set_num_threads(1)
    print(json.dumps(run(int(sys.argv[1]), int(sys.argv[2]))))

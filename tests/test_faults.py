"""API.md section 11 under injected faults: all or nothing, interrupts, hostile input.

Faults come from real registered backends that raise (``tests._fakes.FaultyBackend``,
generators underneath), from real interrupts, from a real file-size limit and from
hostile files loaded in a subprocess. One section per feature; the property test at the
end mixes them.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests._fakes import FaultyBackend, MinimalBackend, registered
from tests._helpers import (
    generator_states,
    generators_of,
    install_plugin,
    plain_state,
    resealed,
    run_env,
    run_python,
    set_environ,
)
from tests._interrupts import after_every_apply, at_every_line, under_real_sigint

import devrng
from devrng import DevRNGError, fork_rng


# ----------------------------------------------------------------------------- helpers
@pytest.fixture
def faulty() -> Iterator[FaultyBackend]:
    with registered("faulty", FaultyBackend("faulty")) as backend:
        yield backend


@pytest.fixture
def other() -> Iterator[FaultyBackend]:
    """A second backend that never fails, to see that it is put back too."""
    with registered("other", FaultyBackend("other")) as backend:
        yield backend


def move_everything(*backends: FaultyBackend) -> None:
    torch.rand(1)
    random.random()
    np.random.random()
    for b in backends:
        for g in b.gens:
            torch.rand(1, generator=g)


# ----------------------------------------------------------------------------- set_rng_state
def test_invalid_cpu_bytes_of_the_right_size_change_nothing() -> None:
    snap = devrng.get_rng_state(devices=[])
    cpu = snap.cpu.clone()
    cpu[8:12] = 255  # MT19937's `left` counter out of range: torch refuses it on set_state
    bad = devrng.RNGState(cpu, {}, snap.python, snap.numpy)
    move_everything()
    before = generator_states()
    with pytest.raises(DevRNGError, match="CPU state is not a valid MT19937 state"):
        devrng.set_rng_state(bad)
    assert before == generator_states()  # Python and NumPy were not applied first


@pytest.mark.parametrize("fault", [RuntimeError("device lost"), KeyboardInterrupt()],
                         ids=["exception", "keyboard-interrupt"])
def test_a_failing_device_set_rolls_back_every_generator(
        faulty: FaultyBackend, other: FaultyBackend, fault: BaseException) -> None:
    snap = devrng.get_rng_state(devices=["other:0", "other:1", "faulty:0", "faulty:1"])
    move_everything(faulty, other)
    before = generator_states(faulty, other)
    faulty.faults["set"] = fault
    faulty.after["set"] = 1  # faulty:0 is set, faulty:1 fails; the rollback of faulty:0 fails too
    expected = DevRNGError if isinstance(fault, Exception) else type(fault)
    with pytest.raises(expected):
        devrng.set_rng_state(snap)
    faulty.faults.clear()
    after = generator_states(faulty, other)
    assert before.without_devices(0) == after.without_devices(0)  # host + other
    # faulty:0 was set and its rollback raised: the error says so (checked below); faulty:1
    # failed before setting and kept its state.
    assert before.devices[0][1] == after.devices[0][1]


def test_rollback_failure_is_reported_with_the_first_error(faulty: FaultyBackend) -> None:
    snap = devrng.get_rng_state(devices=["faulty:0", "faulty:1"])
    faulty.faults["set"] = RuntimeError("device lost")
    faulty.after["set"] = 1
    with pytest.raises(DevRNGError, match=r"Restoring the snapshot failed \(RuntimeError: device "
                       r"lost\), and putting the generators back failed too: .*faulty:0"):
        devrng.set_rng_state(snap)


# ----------------------------------------------------------------------------- hostile snapshots
HOSTILE_NUMPY = {
    "large position": ("pos", 10**6, "position is 1000000; it must be an int from 0 to 624"),
    "negative position": ("pos", -5, "position is -5"),
    "float gauss": ("gauss", "x", "Gaussian cache is 'x'"),
    "zero key": ("key", torch.zeros(624, dtype=torch.int64), "key is all zeros"),
    "float key": ("key", torch.ones(624, dtype=torch.float64), "NumPy key is a torch.float64"),
    "wide key": ("key", torch.full((624,), 2**40, dtype=torch.int64), r"outside \[0, 2\*\*32\)"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_NUMPY))
def test_hostile_numpy_states_are_refused_in_a_subprocess(case: str, tmp_path: Path) -> None:
    field, value, message = HOSTILE_NUMPY[case]
    data = devrng.get_rng_state(devices=[]).to_dict()
    data["numpy"][field] = value
    path = tmp_path / "hostile.rng"
    torch.save(resealed(data), path)  # sealed again: the check behind the digest
    out = run_python(f"""
        import numpy as np, devrng
        before = np.random.get_state(legacy=False)
        try:
            devrng.set_rng_state(devrng.RNGState.load({str(path)!r}))
        except devrng.DevRNGError as err:
            print("refused:", err)
        after = np.random.get_state(legacy=False)
        print("unchanged:", bool((before["state"]["key"] == after["state"]["key"]).all()))
        np.random.random(10)  # the generator still works
        print("alive")
    """)
    assert out.returncode == 0, out.stderr  # a planted bad position would crash here
    assert "refused:" in out.stdout and "unchanged: True" in out.stdout
    assert "alive" in out.stdout
    import re

    assert re.search(message, out.stdout), out.stdout


@pytest.mark.parametrize(("gauss", "message"), [("nan?", r"Gaussian cache is 'nan\?'"),
                                                 (float("inf"), "Gaussian cache is inf")])
def test_python_gauss_cache_must_be_a_finite_float(gauss: Any, message: str) -> None:
    data = devrng.get_rng_state(devices=[]).to_dict()
    data["python"][2] = gauss
    before = random.getstate()
    with pytest.raises(DevRNGError, match=message):
        devrng.RNGState.from_dict(resealed(data))
    assert random.getstate() == before


def test_a_text_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not a snapshot\n")
    with pytest.raises(DevRNGError, match=r"is not a devrng RNG snapshot: it begins with "
                                          r"'hello, t', like a text file"):
        devrng.RNGState.load(path)
    (tmp_path / "empty.rng").write_bytes(b"")
    with pytest.raises(DevRNGError, match="it is empty"):
        devrng.RNGState.load(tmp_path / "empty.rng")


FUZZ = """
import random, sys
import numpy as np, torch
from hypothesis import given, settings, strategies as st, HealthCheck
import devrng
from tests._helpers import resealed

valid = devrng.get_rng_state(devices=[]).to_dict()
leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=5),
    st.sampled_from([torch.zeros(3, dtype=torch.uint8), torch.ones(624, dtype=torch.int64),
                     torch.ones(625, dtype=torch.int64), torch.zeros(5056, dtype=torch.uint8),
                     torch.ones(2, 2), valid["cpu"], torch.full((624,), -1, dtype=torch.int64)]))
trees = st.recursive(leaves, lambda c: st.one_of(
    st.lists(c, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), c,
                                              max_size=4)), max_leaves=12)
paths = [("format",), ("version",), ("cpu",), ("devices",), ("python",), ("python", 0),
         ("python", 1), ("python", 2), ("numpy",), ("numpy", "key"), ("numpy", "pos"),
         ("numpy", "has_gauss"), ("numpy", "gauss"), ("numpy", "bit_generator")]

def mutate(path, value):
    import copy
    data = copy.deepcopy(valid)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data

def state():
    np_state = np.random.get_state(legacy=False)
    return (torch.get_rng_state().tolist(), random.getstate(), np_state["state"]["key"].tolist(),
            np_state["state"]["pos"], np_state["gauss"])

checked = [0]

def attempt(data):
    before = state()
    try:
        snap = devrng.RNGState.from_dict(data)
        devrng.set_rng_state(snap)
    except devrng.DevRNGError as err:
        assert str(err).endswith("."), err
        assert state() == before, "a refused snapshot changed a generator"
        checked[0] += 1
        return
    # Accepted: every generator must work afterwards.
    torch.rand(3); random.random(); random.gauss(0, 1); np.random.random(3); np.random.normal()

@settings(max_examples=int(sys.argv[1]), deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.one_of(trees, st.tuples(st.sampled_from(paths), trees).map(lambda pv: mutate(*pv))))
def fuzz(data):
    # Sealed again, as devrng would have written it: the checks behind the digest are fuzzed.
    attempt(resealed(data) if isinstance(data, dict) else data)

fuzz()
print("refused", checked[0])
"""


def test_fuzzed_hostile_snapshots_never_crash_or_half_apply() -> None:
    out = run_python(FUZZ, args=["400"], timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr  # a segfault is -11 here
    assert int(out.stdout.split()[-1]) > 100  # most fuzzed inputs are refused, not accepted


# ----------------------------------------------------------------------------- saved bytes
def _fuzzed(count: int, seed: int) -> dict[str, Any]:
    """``tests._fuzz``'s report for ``count`` changed inputs of each saved form, run in a
    child (a crash there is a failure here, not the end of the suite)."""
    import json

    out = run_python("tests._fuzz", module=True, args=[str(count), str(seed)], timeout=3600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]  # a segfault is -11
    report: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return report


def _assert_nothing_slipped_through(report: dict[str, Any]) -> int:
    """Every changed input refused with a sentence that changed nothing, or loaded as exactly
    the intact state; returns how many inputs there were."""
    for form, seen in report.items():
        tally = seen["tally"]
        for bad in ("raw", "changed", "half", "mute"):
            assert not tally.get(bad), (form, bad, seen["examples"].get(bad))
        if form == "swapped entries":
            assert tally == {"refused": seen["inputs"]}, tally
            continue
        assert tally["refused"] > seen["inputs"] // 2, (form, tally)
        # A bit flipped in a CPU generator's bytes is always refused, never another state.
        assert not tally.get("flip_hot:same"), (form, tally)
        if form in ("snapshot file", "TrainingRNG entry", "RNGStreams entry"):  # bytes
            assert tally["flip_hot:refused"] > 0 and not tally.get("accepted"), (form, tally)
    return sum(seen["inputs"] for seen in report.values())


def test_fuzzed_saved_forms_are_refused_or_loaded_exactly() -> None:
    """A few hundred changed inputs of each saved form (files and entries with bits flipped,
    cut short, extended; dicts with values, keys or the digest changed, some sealed again):
    no other exception, nothing half-applied, no changed state accepted."""
    assert _assert_nothing_slipped_through(_fuzzed(250, seed=1)) >= 2000


@pytest.mark.slow
def test_twenty_thousand_fuzzed_saved_forms_are_refused_or_loaded_exactly() -> None:
    assert _assert_nothing_slipped_through(_fuzzed(2250, seed=2)) >= 20_000


def _flipped(data: bytes, at: int, bit: int = 0) -> bytes:
    out = bytearray(data)
    out[at] ^= 1 << bit
    return bytes(out)


def _cpu_bytes_at(data: bytes, cpu: torch.Tensor) -> int:
    at = data.find(bytes(cpu.numpy().tobytes()))
    assert at >= 0
    return at


def test_every_flipped_bit_in_a_saved_snapshots_cpu_state_is_refused(tmp_path: Path) -> None:
    """torch's zip reader checks no CRC: one flipped bit in the CPU generator's bytes loaded as
    another state in 200 of 200 tries before files carried a digest."""
    snap = devrng.get_rng_state(devices=[])
    path = tmp_path / "s.rng"
    snap.save(path)
    data = path.read_bytes()
    at = _cpu_bytes_at(data, snap.cpu)
    torch.rand(1)
    before = generator_states()
    for i in range(0, snap.cpu.numel(), 25):  # 203 flips over the whole state
        path.write_bytes(_flipped(data, at + i, i % 8))
        with pytest.raises(DevRNGError, match=r"s\.rng' was altered or damaged after devrng "
                           rf"{devrng.__version__} wrote it: its content does not match the "
                           r"SHA-256 digest written with it .*none of it is loaded\."):
            devrng.set_rng_state(devrng.RNGState.load(path))
    assert generator_states() == before


def test_a_version_1_file_loads_unchecked_so_the_same_flip_is_another_state(
        tmp_path: Path) -> None:
    """Files of devrng 0.4 and before (version 1, no digest) still load, unchecked, as the docs
    say: the flip the digest refuses above loads there as another state."""
    from tests._helpers import unsealed

    snap = devrng.get_rng_state(devices=[])
    path = tmp_path / "old.rng"
    torch.save(unsealed(snap.to_dict(), 1), path)
    data = path.read_bytes()
    path.write_bytes(_flipped(data, _cpu_bytes_at(data, snap.cpu) + 1000, 3))
    loaded = devrng.RNGState.load(path)
    assert loaded != snap and not torch.equal(loaded.cpu, snap.cpu)
    torch.save(unsealed(snap.to_dict(), 1), path)
    assert devrng.RNGState.load(path) == snap


def test_a_flipped_bit_in_each_kind_of_entry_is_refused_naming_the_entry() -> None:
    rng = devrng.TrainingRNG(seed=4)
    streams = devrng.RNGStreams()
    streams.add("a", 1)
    for obj, cpu in ((rng, lambda p: p["rng"]["cpu"]), (streams, lambda p: p["streams"]["a"]["cpu"])):
        saved = obj.state_dict()
        (raw,) = saved.values()
        at = _cpu_bytes_at(raw, cpu(plain_state(saved)))
        with pytest.raises(DevRNGError, match=rf"{type(obj).__name__}.load_state_dict: the entry "
                                              r"'devrng_rank_0' was altered or damaged after "
                                              r"devrng"):
            obj.load_state_dict({"devrng_rank_0": _flipped(raw, at + 7, 5)})
    stream = devrng.portable(9)
    entry = stream.state_dict()["devrng_rank_0"]
    for key, value in (("counter", 1), ("seed", 8), ("world_size", 2), ("rank", 1)):
        with pytest.raises(DevRNGError, match=r"PortableRNG.load_state_dict: the entry "
                                              r"'devrng_rank_0' was altered or damaged"):
            stream.load_state_dict({"devrng_rank_0": {**entry, key: value}})
        with pytest.raises(DevRNGError, match=r"PortableRNG.load_state_dict: the state was "
                                              r"altered or damaged"):
            stream.load_state_dict({**entry, key: value})
    assert (stream.seed, stream.counter) == (9, 0)


def test_an_entry_under_another_ranks_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries swapped between ranks (each one intact): the rank each records is not its key's."""
    stream = devrng.portable(9)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    theirs = stream.state_dict()["devrng_rank_1"]
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(DevRNGError, match=r"the entry 'devrng_rank_0' holds the state that rank 1 "
                                          r"saved: the checkpoint's entries were swapped or moved"):
        stream.load_state_dict({"devrng_rank_0": theirs})
    stream.load_state_dict({"devrng_rank_1": theirs})  # under its own key: rank 1's stream


def test_a_digest_on_an_older_version_is_checked_all_the_same() -> None:
    """A flipped version number must not turn the check off: a state that holds a digest is
    verified whatever version it says."""
    data = devrng.get_rng_state(devices=[]).to_dict()
    data["version"] = 1
    with pytest.raises(DevRNGError, match="altered or damaged"):
        devrng.RNGState.from_dict(data)
    del data["digest"]
    data["version"] = 2
    with pytest.raises(DevRNGError, match=r"has no digest, which every state of its version "
                                          r"carries: it was altered or damaged"):
        devrng.RNGState.from_dict(data)


# Hostile values get a DevRNGError sentence, never another exception (each of these raised
# something else before: RecursionError, IndexError, or was accepted).
def test_a_deeply_nested_seed_in_a_portable_state_is_a_sentence() -> None:
    stream = devrng.portable(1)
    with pytest.raises(DevRNGError, match=r"state_dict\['seed'\] must be an int in \[0, 2\*\*64\), "
                                          r"not \[\[\[\[...\]\]\]\] \(a list\)"):
        stream.load_state_dict({"seed": _deep(100_000), "counter": 0})
    assert (stream.seed, stream.counter) == (1, 0)


def test_a_tensor_where_a_stream_belongs_is_a_sentence() -> None:
    streams = devrng.RNGStreams()
    old = {"format": "devrng.RNGStreams", "version": 1, "streams": {"a": torch.zeros(3)}}
    for state in (old, resealed({**old, "version": 2, "rank": 0, "digest": ""})):
        with pytest.raises(DevRNGError, match=r"Stream 'a' in the RNGStreams state dict is "
                                              r"malformed: it is tensor\(\[0., 0., 0.\]\)"):
            streams.load_state_dict(state)
    assert streams.names == ()


@pytest.mark.parametrize("world", [[[1]], torch.ones(10**6, dtype=torch.int64), 2**64, 0, "2"])
def test_a_junk_world_size_in_a_saved_state_is_refused(world: Any) -> None:
    streams = devrng.RNGStreams()
    streams.add("a", 1)
    state = resealed({**plain_state(streams.state_dict()), "world_size": world})
    with pytest.raises(DevRNGError, match=r"RNGStreams.load_state_dict: the saved world size is "
                                          r".*(not an int of 1 or more|more ranks than any job)"):
        devrng.RNGStreams().load_state_dict(state)
    with pytest.raises(DevRNGError, match=r"PortableRNG.load_state_dict: the saved world size is "
                                          r".*(not an int of 1 or more|more ranks than any job)"):
        devrng.portable(1).load_state_dict({"seed": 1, "counter": 0, "world_size": world})


class _Hostile:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no eq")

    __hash__ = object.__hash__


@pytest.mark.parametrize("make", [_Hostile, lambda: 10**100_000, lambda: _deep(100_000)],
                         ids=["raising", "huge int", "deep"])
def test_hostile_values_anywhere_in_a_small_state_are_sentences(make: Any) -> None:
    value = make()
    step = devrng.seeded_jit(lambda x: x, backend="eager", seed=1)
    stream = devrng.portable(1)
    for load, state in [(step.load_state_dict, step.state_dict()),
                        (stream.load_state_dict, stream.state_dict()["devrng_rank_0"])]:
        for key in state:
            with pytest.raises(DevRNGError):
                load({**state, key: value})
        for key in ("counter", "format"):
            with pytest.raises(DevRNGError):
                load({"format": value} if key == "format" else {**state, key: value})


def _seeded_call(value: Any, *, positional: bool = False) -> None:
    step = devrng.seeded_jit(lambda x: x, backend="eager", seed=1)
    if positional:
        step(torch.ones(1), value)
    else:
        step(torch.ones(1), seed=value)


_ARGUMENT_SITES: dict[str, Callable[[Any], Any]] = {
    "seeded call seed=": _seeded_call,
    "seeded call, seed by position": functools.partial(_seeded_call, positional=True),
    "seed_worker": devrng.seed_worker,
    "sample_rng": lambda value: devrng.sample_rng(value).__enter__(),
    "RNGStreams.add seed": lambda value: devrng.RNGStreams().add("a", value),
    "RNGStreams.add name": lambda value: devrng.RNGStreams().add(value, 1),
    "PortableRNG": devrng.PortableRNG,
    "fork_rng devices=": lambda value: devrng.fork_rng(devices=value).__enter__(),
    "get_rng_state devices=[...]": lambda value: devrng.get_rng_state(devices=[value]),
}
_HUGE = 10**5000  # past Python's 4300 digits for str(int)
_HOSTILE_ARGUMENTS = {"raising repr": _Hostile(), "10**5000": _HUGE, "-10**5000": -_HUGE}
# Where a value is no error: only an int looks like a seed given by position; any int of 0
# or more is a worker id.
_NOT_ERRORS = {("seeded call, seed by position", "raising repr"), ("seed_worker", "10**5000")}


@pytest.mark.parametrize(("site", "kind"), [
    (site, kind) for site in sorted(_ARGUMENT_SITES) for kind in _HOSTILE_ARGUMENTS
    if (site, kind) not in _NOT_ERRORS])
def test_a_hostile_argument_of_a_public_call_is_named_in_a_sentence(site: str,
                                                                     kind: str) -> None:
    """A value whose repr raises, or an int too long for str(), is quoted by short_repr,
    never let through as the repr's error or Python's digit-limit ValueError."""
    value = _HOSTILE_ARGUMENTS[kind]
    with pytest.raises((TypeError, ValueError)) as caught:
        _ARGUMENT_SITES[site](value)
    shown = "<_Hostile>" if kind == "raising repr" else "<an int of 16610 bits>"
    message = str(caught.value)
    assert shown in message and message.endswith("."), message


def test_one_bounded_formatter_quotes_any_value() -> None:
    """short_repr: bounded in length, nesting and cost, whatever the value."""
    import time

    from tests._internals import short_repr

    loop: list[Any] = []
    loop.append(loop)

    class Recursing:
        def __repr__(self) -> str:
            return repr(self)

    started = time.perf_counter()
    cases = {
        "expanded": torch.zeros(1).expand(10**12), "huge int": 10**100_000,
        "deep": _deep(100_000), "loop": loop, "long": list(range(10**7)), "text": "x" * 10**8,
        "raising": _Hostile(), "recursing": Recursing(),
    }
    shown = {name: short_repr(value) for name, value in cases.items()}
    assert time.perf_counter() - started < 5  # each is cut before it is formatted whole
    assert all(len(text) <= 60 for text in shown.values()), shown
    assert shown["expanded"] == "<a torch.float32 tensor of shape (1000000000000,)>"
    assert shown["huge int"] == "<an int of 332193 bits>"
    assert shown["deep"] == "[[[[...]]]]" and shown["loop"] == "[[[[...]]]]"
    assert shown["long"] == "[0, 1, 2, 3, 4, 5, ...]"
    assert shown["raising"] == "<_Hostile>" and shown["recursing"] == "<Recursing>"
    assert short_repr(torch.tensor(1)) == "tensor(1)"


# ----------------------------------------------------------------------------- saving files
def test_a_save_that_hits_the_file_size_limit_keeps_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "state.rng"
    devrng.get_rng_state(devices=[]).save(path)
    good = path.read_bytes()
    out = run_python(f"""
        import resource, signal, torch, devrng
        torch.manual_seed(1)
        snap = devrng.get_rng_state(devices=[])  # devrng's modules load before the limit
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit raises instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            snap.save({str(path)!r})
        except OSError as err:
            print("failed:", type(err).__name__, err)
    """, env={"PYTHONDONTWRITEBYTECODE": "1"})  # Python would write cut-off .pyc files
    assert out.returncode == 0, out.stderr
    # An OSError whose sentence names the file and says the previous one is kept.
    assert "failed: OSError [Errno 27] File too large while writing" in out.stdout, out.stdout
    assert "the file that was there (if any) is unchanged" in out.stdout
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.rng"]  # no temporary left


def test_an_interrupted_save_keeps_the_previous_file(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.rng"
    devrng.get_rng_state(devices=[]).save(path)
    good = path.read_bytes()
    real_save = torch.save

    def interrupted(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        devrng.get_rng_state(devices=[]).save(path)
    monkeypatch.setattr(torch, "save", real_save)
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.rng"]


def test_save_and_load_take_file_objects() -> None:
    import io

    snap = devrng.get_rng_state(devices=[])
    buffer = io.BytesIO()
    snap.save(buffer)
    buffer.seek(0)
    assert devrng.RNGState.load(buffer) == snap
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["format"] == "devrng.RNGState"


def test_saved_files_get_the_usual_permissions(tmp_path: Path) -> None:
    path = tmp_path / "state.rng"
    devrng.get_rng_state(devices=[]).save(path)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "state.rng"
    devrng.get_rng_state(devices=[]).save(target)
    link = tmp_path / "latest.rng"
    link.symlink_to(target)
    torch.manual_seed(3)
    snap = devrng.get_rng_state(devices=[])
    snap.save(link)
    assert link.is_symlink() and link.resolve() == target
    assert devrng.RNGState.load(target) == snap
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["state.rng"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.rng", "real"]


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "link to a fifo"])
def test_special_files_are_never_replaced(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "special"
    if kind in ("fifo", "link to a fifo"):
        os.mkfifo(tmp_path / "fifo")
        if kind == "fifo":
            path = tmp_path / "fifo"
        else:
            path.symlink_to(tmp_path / "fifo")
    elif kind == "device":  # a copy of /dev/null, made where the test may make one
        null = os.stat("/dev/null")
        os.mknod(path, 0o666 | stat.S_IFCHR, null.st_rdev)
    else:
        path.mkdir()
    before = os.lstat(path)
    word = {"fifo": "a FIFO", "device": "a device", "directory": "a directory",
            "link to a fifo": "a FIFO"}[kind]
    with pytest.raises(ValueError, match=f"is {word}; devrng saves to regular files only"):
        devrng.get_rng_state(devices=[]).save(path)
    after = os.lstat(path)
    assert (before.st_mode, before.st_ino) == (after.st_mode, after.st_ino)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".devrng-tmp")]


def test_a_long_file_name_saves(tmp_path: Path) -> None:
    path = tmp_path / ("s" * 246 + ".rng")  # 250 characters: the most most file systems allow
    snap = devrng.get_rng_state(devices=[])
    snap.save(path)
    assert devrng.RNGState.load(path) == snap


def test_a_save_killed_by_sigterm_leaves_nothing_the_next_save_keeps(tmp_path: Path) -> None:
    path = tmp_path / "state.rng"
    devrng.get_rng_state(devices=[]).save(path)
    good = path.read_bytes()
    code = f"""
        import os, sys, time, torch, devrng
        def slow(fd):  # the snapshot is in the temporary file, not yet synced and renamed
            print("writing", flush=True)
            time.sleep(60)
        os.fsync = slow
        devrng.get_rng_state(devices=[]).save({str(path)!r})
    """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], text=True,
                            stdout=subprocess.PIPE, env=run_env())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    left = [p.name for p in tmp_path.iterdir() if p.name.endswith(".devrng-tmp")]
    assert len(left) == 1  # the killed writer's temporary file
    assert path.read_bytes() == good
    devrng.get_rng_state(devices=[]).save(path)  # a later save to the path removes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.rng"]


@pytest.mark.parametrize("version", [2, 1])  # with a digest (checked after the sizes) or without
def test_a_stride_zero_memory_bomb_is_refused_at_load(tmp_path: Path, version: int) -> None:
    shown = "(1000000000000 bytes); generator states are compact"
    from tests._helpers import unsealed

    data = devrng.get_rng_state(devices=[]).to_dict()
    if version == 1:
        data = unsealed(data, 1)
    data["devices"] = {"cpu2": {0: torch.zeros(1, dtype=torch.uint8).expand(10**12)}}
    path = tmp_path / "bomb.rng"
    torch.save(data, path)
    assert path.stat().st_size < 64_000
    out = run_python(f"""
        import resource
        import devrng
        devrng.RNGState  # torch and devrng's modules load before the limit
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # the bomb would need 1 TB
        try:
            devrng.RNGState.load({str(path)!r})
        except devrng.DevRNGError as err:
            print("refused:", err)
    """)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and shown in out.stdout, out.stdout


def test_a_state_holding_an_expanded_tensor_is_refused_when_saved() -> None:
    """A tracked object's state is hashed into the TrainingRNG state's digest: a tensor
    expanded over one byte (10**12 elements, stride 0) is refused before hashing would
    read all of them."""

    class Expanded:
        def state_dict(self) -> dict[str, Any]:
            return {"x": torch.zeros(1, dtype=torch.uint8).expand(10**12)}

        def load_state_dict(self, state: Any) -> None:
            pass

    rng = devrng.TrainingRNG(seed=1)
    rng.track("expanded", Expanded())
    with pytest.raises(DevRNGError, match=r"'devrng.TrainingRNG' state cannot be saved: it holds "
                                          r"a tensor of shape \(1000000000000,\) "
                                          r"\(1000000000000 bytes\) that is not a dense tensor "
                                          r"whose elements lie in its own storage"):
        rng.state_dict()


@pytest.mark.parametrize(("path", "error", "message"), [
    (b"state.rng", TypeError, r"devrng cannot write to b'state.rng' \(a bytes\); pass a path "
                              r"as a str or os.PathLike"),
    ("run/", ValueError, r"devrng cannot write to 'run/': it names a directory \(or nothing\)"),
    ("", ValueError, r"devrng cannot write to '': it names a directory \(or nothing\)"),
    (3, TypeError, r"devrng cannot write to 3 \(a int\)"),
])
def test_a_path_that_names_no_file_gets_a_sentence_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: Any, error: type[Exception],
        message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    with pytest.raises(error, match=message):
        devrng.get_rng_state(devices=[]).save(path)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["run"]
    with pytest.raises(error, match=message.replace("write to", "load")):
        devrng.RNGState.load(path)


def test_loading_from_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    # Opening a FIFO waits for a writer forever: refused before it is opened.
    fifo = tmp_path / "state.rng"
    os.mkfifo(fifo)
    out = run_python(f"""
        import devrng
        try:
            devrng.RNGState.load({str(fifo)!r})
        except devrng.DevRNGError as err:
            print("refused:", err)
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "is not a devrng RNG snapshot: it is a FIFO, not a regular file" in out.stdout


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("where", ["cpu", "python", "devices"])
def test_a_deeply_nested_snapshot_is_refused_in_a_subprocess(tmp_path: Path, where: str) -> None:
    data = devrng.get_rng_state(devices=[]).to_dict()
    data[where] = {"cpu": {0: _deep(3000)}} if where == "devices" else _deep(3000)
    path = tmp_path / "deep.rng"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # torch.save's pickler recurses
    try:
        torch.save(data, path)
    finally:
        sys.setrecursionlimit(limit)
    out = run_python(f"""
        import devrng
        try:
            devrng.RNGState.load({str(path)!r})
        except devrng.DevRNGError as err:
            print("refused:", err)
    """)
    assert out.returncode == 0, out.stderr
    assert f"refused: {str(path)!r} nests lists and dicts more than 32 deep" in out.stdout


def test_a_small_checkpoint_with_a_loader_record_bomb_is_refused_in_bounded_memory(
        tmp_path: Path) -> None:
    # A loader record holding a tensor that claims 2**31 elements over one byte of storage:
    # comparing it with the live loader's batch size would allocate gigabytes.
    rng = devrng.TrainingRNG(seed=1)
    rng.track("loader", torch.utils.data.DataLoader(range(8), batch_size=2))
    saved = plain_state(rng.state_dict())
    saved["loaders"]["loader"]["batch_size"] = torch.zeros(1, dtype=torch.uint8).expand(2**31)
    path = tmp_path / "ckpt.pt"
    torch.save({"rng": saved}, path)
    assert path.stat().st_size < 64_000
    out = run_python(f"""
        import resource, torch, devrng
        rng = devrng.TrainingRNG(seed=1)
        rng.track("loader", torch.utils.data.DataLoader(range(8), batch_size=2))
        saved = torch.load({str(path)!r}, weights_only=True)["rng"]
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
        try:
            rng.load_state_dict(saved)
        except devrng.DevRNGError as err:
            print("refused:", err)
    """)
    assert out.returncode == 0, out.stderr
    assert "refused: TrainingRNG.load_state_dict: the state holds a tensor of shape " \
           "(2147483648,) (2147483648 bytes)" in out.stdout, out.stdout


@pytest.mark.parametrize(("rank", "world", "message"), [
    (0, 0, "the saved world size is 0, not an int of 1 or more"),
    (2, 2, "the saved rank 2 is not a rank of the saved world size 2"),
    (-1, 2, "the saved rank is -1, not an int of 0 or more"),
])
def test_a_saved_world_that_cannot_be_is_refused_even_when_not_strict(
        rank: int, world: int, message: str) -> None:
    rng = devrng.TrainingRNG(seed=1)
    saved = plain_state(rng.state_dict())
    saved["rank"], saved["world_size"] = rank, world
    before = generator_states()
    with pytest.raises(DevRNGError, match=message):
        rng.load_state_dict(resealed(saved), strict=False)
    assert generator_states() == before


# ----------------------------------------------------------------------------- interrupts
@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_the_body_propagates_even_when_a_restore_fails(
        faulty: FaultyBackend, interrupt: type[BaseException]) -> None:
    caught = None
    try:
        try:
            with fork_rng(devices=["faulty:0"]):
                faulty.faults["set"] = RuntimeError("cannot restore")
                raise interrupt()
        except Exception:  # what user code often writes: it must not swallow the interrupt
            pytest.fail("the interrupt was replaced by an Exception")
    except interrupt as err:
        caught = err
    assert caught is not None
    assert "could not restore 1 generator(s): faulty:0" in "\n".join(
        getattr(caught, "__notes__", []))


def test_an_interrupt_while_restoring_one_generator_restores_the_others(
        faulty: FaultyBackend, other: FaultyBackend) -> None:
    before = generator_states(faulty, other)

    def body() -> None:
        with fork_rng(devices=["other:0", "faulty:0", "other:1"], python=True, numpy=True):
            move_everything(faulty, other)
            faulty.faults["set"] = KeyboardInterrupt()

    with pytest.raises(KeyboardInterrupt):
        body()
    faulty.faults.clear()
    after = generator_states(faulty, other)
    assert before.without_devices(0) == after.without_devices(0)


def test_an_interrupt_in_the_fast_restore_path_still_restores_all(
        faulty: FaultyBackend, other: FaultyBackend) -> None:
    before = generator_states(faulty, other)
    faulty.faults["set"] = KeyboardInterrupt()
    faulty.after["set"] = 0
    with pytest.raises(KeyboardInterrupt):
        with fork_rng(devices=["faulty:0", "other:0"]):  # no host states: the fast path
            move_everything(faulty, other)
    faulty.faults.clear()
    after = generator_states(faulty, other)
    assert before.cpu == after.cpu
    assert before.devices[1][0] == after.devices[1][0]


# ----------------------------------------------------------------------------- seeding
@pytest.mark.parametrize("fault", [RuntimeError("seed failed"), KeyboardInterrupt()],
                         ids=["exception", "keyboard-interrupt"])
def test_manual_seed_is_all_or_nothing(faulty: FaultyBackend, other: FaultyBackend,
                                       fault: BaseException) -> None:
    move_everything(faulty, other)
    before = generator_states(faulty, other)
    faulty.faults["seed"] = fault
    with pytest.raises(DevRNGError if isinstance(fault, Exception) else type(fault)):
        devrng.manual_seed(5)
    faulty.faults.clear()
    assert before == generator_states(faulty, other)


def test_deterministic_with_a_failing_seed_changes_nothing(faulty: FaultyBackend) -> None:
    flags = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    before = generator_states(faulty)
    faulty.faults["seed"] = RuntimeError("seed failed")
    with pytest.raises(DevRNGError, match=r"manual_seed\(3\) failed"):
        devrng.deterministic(seed=3)
    faulty.faults.clear()
    assert before == generator_states(faulty)
    assert flags == (torch.are_deterministic_algorithms_enabled(),
                     torch.backends.cudnn.deterministic, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))


# ----------------------------------------------------------------------------- deterministic() handles
def _settings_now() -> tuple[Any, ...]:
    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
            torch.utils.deterministic.fill_uninitialized_memory,
            os.environ.get("CUBLAS_WORKSPACE_CONFIG"), torch.get_rng_state())


def _same_settings(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return a[:-1] == b[:-1] and torch.equal(a[-1], b[-1])


@pytest.fixture
def clean_env() -> Iterator[None]:
    saved = {k: os.environ.pop(k, None) for k in ("CUBLAS_WORKSPACE_CONFIG",
                                                  "TORCHINDUCTOR_DETERMINISTIC")}
    yield
    set_environ(saved)


@pytest.mark.parametrize("count", [2, 3])
def test_handles_restored_in_any_order_end_where_the_program_started(count: int,
                                                                    clean_env: None) -> None:
    for order in itertools.permutations(range(count)):
        start = _settings_now()
        handles = [devrng.deterministic(seed=i, warn_only=bool(i % 2),
                                        fill_uninitialized_memory=i != 1) for i in range(count)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in order:
                handles[i].restore()
        assert _same_settings(start, _settings_now()), f"restore order {order}"
        assert not any(h.active for h in handles)
        # One warning for each restore that switches off a newer active handle; none when
        # restored newest first.
        active, early = list(range(count)), 0
        for i in order:
            if i in active:
                early += active[-1] != i
                del active[active.index(i):]
        assert [w.category for w in caught] == [devrng.DevRNGWarning] * early, order


def test_nested_and_reentered_handles_end_where_they_started(clean_env: None) -> None:
    start = _settings_now()
    with devrng.deterministic(seed=1) as outer, outer:  # entered twice: the outer exit restores
        with devrng.deterministic(seed=2, warn_only=True):
            assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert outer.active
    assert _same_settings(start, _settings_now())
    with outer:  # a restored handle applies again when entered
        assert torch.are_deterministic_algorithms_enabled()
    assert _same_settings(start, _settings_now())


def test_restoring_an_outer_handle_restores_the_inner_one_first(clean_env: None) -> None:
    start = _settings_now()
    outer = devrng.deterministic()
    inner = devrng.deterministic(warn_only=True)
    with pytest.warns(devrng.DevRNGWarning,
                      match=r"Restoring <devrng.deterministic seed=None warn_only=False active> "
                            r"first restored 1 handle\(s\) applied after it and still active "
                            r"\(<devrng.deterministic seed=None warn_only=True active>\): their "
                            r"settings are off from here on. Restore handles newest first"):
        outer.restore()
    assert not inner.active
    inner.restore()  # nothing left to do
    assert _same_settings(start, _settings_now())


# ----------------------------------------------------------------------------- plugins
PLUGIN_CASES = {
    "raises on import": ("plugdev = broken_mod:backend",
                         "raise RuntimeError('plugin exploded')\n", "plugin exploded"),
    "names no attribute": ("plugdev = plain_mod", "x = 1\n", "does not satisfy devrng.Backend"),
    "not a backend": ("plugdev = odd_mod:backend", "backend = object()\n",
                      "does not satisfy devrng.Backend"),
    "exits on import": ("plugdev = exiting_mod:backend", "import sys\nsys.exit(3)\n",
                        "SystemExit: 3"),
    "cannot count its devices": (
        "plugdev = counting_mod:backend",
        "from tests._fakes import MinimalBackend\n"
        "class Backend(MinimalBackend):\n"
        "    name = 'plugdev'\n"
        "    def device_count(self):\n"
        "        raise RuntimeError('the driver is gone')\n"
        "backend = Backend()\n",
        "failed to count its devices (RuntimeError: the driver is gone)"),
}


@pytest.mark.parametrize("case", sorted(PLUGIN_CASES))
def test_a_broken_plugin_breaks_nothing_that_does_not_name_it(case: str, tmp_path: Path) -> None:
    entry, module_source, reason = PLUGIN_CASES[case]
    env = install_plugin(tmp_path, entry, module_source, name="devrng-badplugin")
    out = run_python("""
        import warnings, devrng
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            print("available", devrng.available_backends())
            devrng.manual_seed(3)
            with devrng.deterministic(seed=1):
                pass
        print("warned", [str(w.message) for w in seen])
        try:
            devrng.get_rng_state(devices=["plugdev:0"])
        except Exception as err:
            print("named:", type(err).__name__, err)
    """, env=env)
    assert out.returncode == 0, out.stderr
    assert "available ('cpu',)" in out.stdout
    warned = out.stdout.split("warned", 1)[1]
    assert "plugdev" in warned and "devrng-badplugin" in warned and reason in warned
    named = out.stdout.split("named:", 1)[1]
    assert reason in named and "devrng-badplugin" in named
    doctor = run_python("devrng", module=True, args=["doctor"], env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    # selftest checks every installed backend: the broken one is its FAIL row, the rest pass.
    selftest = run_python("devrng", module=True, args=["selftest"], env=env)
    assert selftest.returncode == 1, selftest.stdout + selftest.stderr
    [row] = [line for line in selftest.stdout.splitlines() if line.startswith("plugdev ")]
    assert "FAIL" in row and reason in row, row
    assert selftest.stdout.rstrip().endswith(" passed, 1 failed")  # only the plugin failed
    assert "Traceback" not in doctor.stderr + selftest.stderr


@pytest.mark.parametrize("count", [None, "2", 1.5, 10**20, True])
def test_a_backend_that_lies_about_its_device_count_is_named(count: Any) -> None:
    class Liar(MinimalBackend):
        name = "liar"

        def device_count(self) -> Any:
            return count

    with registered("liar", Liar()):
        with pytest.raises(TypeError, match=r"The devrng backend 'liar' reported device_count\(\) "
                                            r"= .*; a backend must return an int from 0 to 65536"):
            devrng.get_rng_state(devices=["liar:0"])


# ----------------------------------------------------------------------------- threads
def test_seeded_calls_from_threads_equal_the_same_calls_made_serially() -> None:
    step = devrng.seeded_jit(lambda x: torch.nn.functional.dropout(x, 0.5), backend="eager",
                             seed=0)
    x = torch.ones(2000)
    serial = {s: step(x, seed=s) for s in range(16)}
    results: dict[int, torch.Tensor] = {}
    barrier = threading.Barrier(4)

    def worker(seeds: list[int]) -> None:
        barrier.wait()
        for _ in range(5):
            for s in seeds:
                results[s] = step(x, seed=s)

    threads = [threading.Thread(target=worker, args=(list(range(i, 16, 4)),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(results[s], serial[s]) for s in serial)


def test_fork_rng_on_an_async_function_forks_across_the_awaited_body() -> None:
    @fork_rng()
    async def draw() -> torch.Tensor:
        await asyncio.sleep(0)
        return torch.rand(3)

    before = torch.get_rng_state()
    inside = asyncio.run(draw())
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(inside, torch.rand(3))


def test_fork_rng_refuses_generator_functions() -> None:
    def gen() -> Iterator[int]:
        yield 1

    with pytest.raises(TypeError, match="cannot decorate the generator function"):
        fork_rng()(gen)


# ----------------------------------------------------------------------------- input validation
@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: fork_rng(device_type="cuda:5"), ValueError,
     r"device_type='cuda:5' names a device, not a device type; pass device_type='cuda'"),
    (lambda: fork_rng(devices=b"cpu"), TypeError, r"devices=b'cpu' \(a bytes\); pass device strings"),
    (lambda: fork_rng(devices=object()), TypeError, r"neither a device nor a collection"),
    (lambda: fork_rng(devices=[], python=1), TypeError, r"python must be True or False, not 1"),
    (lambda: devrng.get_rng_state(numpy="yes"), TypeError, r"numpy must be True or False"),
    (lambda: devrng.manual_seed(1, python=None), TypeError, r"python must be True or False"),
    (lambda: devrng.deterministic(cublas_workspace_config=":4096:8\n"), ValueError,
     r"not a cuBLAS workspace setting"),
    (lambda: devrng.deterministic(cublas_workspace_config=":4096:8 "), ValueError,
     r"not a cuBLAS workspace setting"),
    (lambda: devrng.seed_worker("0"), TypeError, r"seed_worker takes the worker id"),
    (lambda: devrng.deterministic(True), TypeError, r"first argument is the seed"),
])
def test_bad_input_is_a_clear_error(call: Callable[[], Any], error: type[Exception],
                                    message: str) -> None:
    with pytest.raises(error, match=message):
        with call():  # type: ignore[attr-defined]
            pass


def test_cyclic_and_pathologically_deep_devices_are_clear_errors() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match=r"devices contains itself"):
        devrng.infer_device_types(cyclic)
    deep: Any = "cpu"
    for _ in range(20_000):
        deep = [deep]
    with pytest.raises(ValueError, match=r"nested more than 10000 levels deep"):
        devrng.infer_device_types(deep)


def test_a_rank_beyond_64_bits_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", str(2**64))
    with pytest.raises(ValueError, match=r"RANK environment variable is 18446744073709551616"):
        devrng.distributed.rank_seed(1)


# ----------------------------------------------------------------------------- bad state is refused
def test_streams_refuse_a_zero_cpu_state_and_junk_device_states(faulty: FaultyBackend) -> None:
    streams = devrng.RNGStreams()
    streams.add("a", 1)
    with streams.fork("a", devices=["faulty:0"]):
        pass
    good = plain_state(streams.state_dict())
    cases = [
        (lambda sd: sd["streams"]["a"].update(cpu=torch.zeros(5056, dtype=torch.uint8)),
         DevRNGError, r"Stream 'a''s CPU state is not a valid MT19937 state"),
        (lambda sd: sd["streams"]["a"]["devices"]["faulty"].update({0: torch.zeros(3)}),
         DevRNGError, r"The snapshot's faulty:0 state is a torch.float32 tensor of shape \(3,\)"),
        (lambda sd: sd["streams"]["a"]["devices"]["faulty"].update({7: faulty.states()[0]}),
         DevRNGError, r"holds a state for faulty:7, but this process has 2 faulty device"),
        (lambda sd: sd["streams"]["a"]["devices"].update(nodev={0: torch.zeros(1)}),
         DevRNGError, r"holds nodev states, but this process cannot reach nodev devices"),
        (lambda sd: sd["streams"]["a"]["devices"]["faulty"].update({"0": faulty.states()[0]}),
         DevRNGError, r"names the faulty device index '0'"),
    ]
    for change, error, message in cases:
        sd = copy.deepcopy(good)
        change(sd)
        target = devrng.RNGStreams()
        with pytest.raises(error, match=message):
            target.load_state_dict(resealed(sd))
        assert target.names == ()


def test_training_rng_refuses_names_kept_for_its_own_generators() -> None:
    rng = devrng.TrainingRNG(seed=3)
    with pytest.raises(ValueError, match=r"the name 'dataloader1' is kept for the generators "
                                         r"dataloader_kwargs\(\) makes"):
        rng.track("dataloader1", torch.Generator())


def test_training_rng_refuses_an_empty_loader_state_that_would_start_the_epoch_over() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")  # in the core environment
    rng = devrng.TrainingRNG(seed=3)
    loader = rng.track("loader", stateful.StatefulDataLoader(range(8), batch_size=2,
                                                             shuffle=True))
    next(iter(loader))
    saved = plain_state(rng.state_dict())
    for empty in ({}, None):
        saved["tracked"]["loader"] = empty
        with pytest.raises(DevRNGError, match=rf"the saved state of the tracked object 'loader' "
                                              rf"is {empty!r}, which would start it afresh"):
            rng.load_state_dict(resealed(saved))


@pytest.mark.parametrize(("change", "message"), [
    (lambda sd: sd.update({1: 2, "x": 3}), r"the state has unknown keys 'x', 1"),
    (lambda sd: sd.update(version=torch.tensor(1)), r"the state is version tensor\(1\)"),
    (lambda sd: sd.update(rank="0"), r"the saved rank is '0', not an int of 0 or more"),
    (lambda sd: sd.update(world_size=torch.tensor(1)), r"the saved world size is tensor\(1\)"),
    (lambda sd: sd["tracked"].update({5: {}}), r"the checkpoint holds tracked objects 5, which "
                                              r"nothing here tracks"),
])
def test_training_rng_states_of_odd_types_get_sentences(change: Any, message: str) -> None:
    rng = devrng.TrainingRNG(seed=3)
    saved = plain_state(rng.state_dict())
    change(saved)
    with pytest.raises(DevRNGError, match=message):
        rng.load_state_dict(resealed(saved))


def test_per_rank_state_of_the_wrong_shape_gets_a_sentence() -> None:
    from tests._internals import PerRankState

    state = PerRankState(devrng.TrainingRNG(seed=1), owner="DevRNGCallback")
    for bad, shown in [({"ranks": {0: {}}}, "the keys 'ranks'"), ({1: 0, "a": 1}, "the keys 'a', 1"),
                       (None, "a NoneType"), ({}, "the keys ")]:
        with pytest.raises(DevRNGError, match=f"DevRNGCallback: the checkpoint holds no devrng RNG "
                                              f"state \\(its entry is .*{shown}"):
            state.load_state_dict(bad)  # type: ignore[arg-type]


def test_sample_rng_takes_numpy_ints_and_refuses_indices_that_would_wrap() -> None:
    with devrng.sample_rng(np.int64(3)):
        pass
    with pytest.raises(ValueError, match=r"sample_rng got the index 18446744073709551616; a "
                                         r"sample's index must be from 0 to 2\*\*64 - 1"):
        with devrng.sample_rng(2**64):
            pass
    with pytest.raises(TypeError, match=r"sample_rng takes the sample's index"):
        with devrng.sample_rng(1.0):  # type: ignore[arg-type]
            pass


@pytest.mark.parametrize("call", [
    lambda: fork_rng(devices="cuda"),
    lambda: fork_rng(devices=[torch.device("cuda")]),
    lambda: devrng.manual_seed(1, devices=["cuda"]),
    lambda: devrng.get_rng_state(devices=["mps"]),
    lambda: fork_rng(devices=["xpu"]),
], ids=["cuda string", "cuda device", "manual_seed", "mps", "xpu"])
def test_absent_devices_named_without_an_index_get_a_sentence(call: Callable[[], Any]) -> None:
    with pytest.raises(ValueError, match=r"Device '(cuda|mps|xpu)' does not exist: this process "
                                         r"has no \1 device\. Name only devices this process has"):
        with call():  # type: ignore[attr-defined]
            pass


def test_cpu_indices_with_device_type_cpu_are_the_cpu() -> None:
    before = torch.get_rng_state()
    with fork_rng(devices=[0], device_type="cpu"):
        torch.rand(2)
    assert torch.equal(before, torch.get_rng_state())


def test_training_rng_whose_seeding_fails_leaves_nothing_on(faulty: FaultyBackend,
                                                            clean_env: None) -> None:
    os.environ.pop("DEVRNG_SEED", None)
    before = (generator_states(faulty), _settings_now()[:-1])
    faulty.faults["seed"] = RuntimeError("seed failed")
    with pytest.raises(DevRNGError, match=r"manual_seed\(7\) failed"):
        devrng.TrainingRNG(seed=7, deterministic=True)
    faulty.faults.clear()
    assert (generator_states(faulty), _settings_now()[:-1]) == before
    assert "DEVRNG_SEED" not in os.environ


def test_doctor_with_standard_output_closed_says_so() -> None:
    out = run_python("""
        import os, subprocess, sys
        proc = subprocess.run([sys.executable, "-m", "devrng", "doctor"], stdout=None,
                              stderr=subprocess.PIPE, text=True, close_fds=True,
                              preexec_fn=lambda: os.close(1))
        print(proc.returncode, proc.stderr.strip())
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("1 devrng: standard output is closed"), out.stdout
    assert "Traceback" not in out.stdout


# ----------------------------------------------------------------------------- locks and os.fork
def test_a_process_forked_while_a_thread_is_inside_a_seeded_call_does_not_hang() -> None:
    out = run_python("""
        import os, threading, time, torch, devrng
        inside, leave = threading.Event(), threading.Event()

        def slow(x):
            inside.set()
            leave.wait()
            return x

        held = devrng.seeded_jit(slow, backend="eager", seed=0)
        step = devrng.seeded_jit(lambda x: x + torch.rand(1), backend="eager", seed=0)
        thread = threading.Thread(target=held, args=(torch.zeros(1),))
        thread.start()
        inside.wait()
        pid = os.fork()  # as a DataLoader worker is started, while the thread holds the lock
        if pid == 0:
            step(torch.zeros(1), seed=1)
            devrng.manual_seed(2)
            os._exit(0)
        for _ in range(600):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            status = "hung"
        leave.set()
        thread.join()
        print("child", status)
    """, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "child 0"


# ----------------------------------------------------------------------------- seeded_jit
def test_a_function_with_its_own_seed_parameter_is_refused_at_wrap_time() -> None:
    def step(x: torch.Tensor, seed: int) -> torch.Tensor:
        return x * seed

    with pytest.raises(TypeError, match=r"has a parameter named 'seed'"):
        devrng.seeded_jit(step, backend="eager")


def test_a_failing_wrap_leaves_the_cpu_generator_alone() -> None:
    before = torch.get_rng_state()
    with pytest.raises(TypeError, match="takes no compile options"):
        devrng.seeded_jit(lambda x: x, backend="eager", mode="max-autotune")
    with pytest.raises(ValueError, match="accepted backends"):
        devrng.seeded_jit(lambda x: x, backend="nope")
    assert torch.equal(torch.get_rng_state(), before)


def test_a_positional_seed_says_seed_is_keyword_only() -> None:
    step = devrng.seeded_jit(lambda x: x + 1, backend="eager", seed=0)
    with pytest.raises(TypeError, match=r"seed is keyword-only: call the function as f\(\.\.\., "
                                        r"seed=7\)"):
        step(torch.ones(1), 7)


# ----------------------------------------------------------------------------- opaque states
def test_opaque_states_cannot_be_fingerprinted() -> None:
    class Opaque(MinimalBackend):
        name = "opaque"

        def get_rng_state(self, index: int) -> Any:
            return object()

    with registered("opaque", Opaque()):
        snap = devrng.get_rng_state(devices=["opaque:0"])
        with pytest.raises(DevRNGError, match="cannot be fingerprinted: it is not plain data"):
            snap.fingerprint()
        assert "not plain data" in repr(snap)


# ----------------------------------------------------------------------------- fork reads devices on entry
def test_a_devices_list_filled_after_construction_is_honoured(faulty: FaultyBackend) -> None:
    devices: list[Any] = []
    fork = fork_rng(devices=devices)
    devices.append("faulty:1")
    before = faulty.states()
    with fork:
        torch.rand(1, generator=faulty.gens[1])
    assert torch.equal(faulty.states()[1], before[1])
    devices.clear()  # and emptied again: back to the CPU alone
    with fork:
        torch.rand(1, generator=faulty.gens[1])
    assert not torch.equal(faulty.states()[1], before[1])


# ----------------------------------------------------------------------------- reports
def test_a_shape_mismatch_headlines_as_a_mismatch() -> None:
    report = devrng.testing.compare(torch.ones(3), torch.ones(4))
    assert str(report).startswith("MISMATCH: output: shape (3,) vs (4,) in the reference")
    assert not report.ok


# ----------------------------------------------------------------------------- everything at once
_RESTORING = ["fork", "fork_host", "snapshot", "seed", "deterministic"]
# The outermost op restores (a bare draw at the top would be the caller's own change).
OPS = st.tuples(st.sampled_from(_RESTORING),
                st.lists(st.sampled_from([*_RESTORING, "draw"]), max_size=5)).map(
    lambda first_rest: [first_rest[0], *first_rest[1]])
FAULTS = st.sampled_from([None, ("get", RuntimeError), ("set", RuntimeError),
                          ("seed", RuntimeError), ("set", KeyboardInterrupt),
                          ("seed", KeyboardInterrupt), ("get", KeyboardInterrupt)])


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, fault=FAULTS, when=st.integers(0, 5))
def test_random_nestings_with_random_faults_end_where_they_started(
        ops: list[str], fault: tuple[str, type[BaseException]] | None, when: int) -> None:
    """Every op restores what it changed, or, when its own restore fails, refuses to half-apply:
    each generator ends as at the start, or -- after a restore that raised -- exactly as just
    before that restore; generators whose backend refused to be set again are named in the
    error. Settings always end as they started; interrupts propagate as themselves."""
    saved_env = {k: os.environ.get(k) for k in ("CUBLAS_WORKSPACE_CONFIG",
                                                "TORCHINDUCTOR_DETERMINISTIC")}
    with registered("faulty", FaultyBackend("faulty")) as faulty, \
            registered("other", FaultyBackend("other")) as other:
        start = generator_states(faulty, other)
        settings_start = _settings_now()[:-1]
        if fault is not None:
            faulty.faults[fault[0]] = fault[1]("injected")  # type: ignore[call-arg]
            faulty.after[fault[0]] = when
        raised: BaseException | None = None
        failed_restores: list[tuple[Any, ...]] = []
        try:
            _nest(ops, faulty, other, failed_restores)
        except BaseException as err:
            raised = err
        faulty.faults.clear()
        end = generator_states(faulty, other)
        text = "" if raised is None else str(raised) + "".join(getattr(raised, "__notes__", []))
        # A restore that the backend refused is reported, never silent; what it could not
        # put back is its own test's subject (above). Without one, all is as it started.
        if not any(word in text for word in ("could not restore", "Restoring the snapshot",
                                             "putting the generators back failed")):
            assert start == end or any((pre == end) for pre in failed_restores), (
                ops, fault, when, raised)
        assert _settings_now()[:-1] == settings_start
        if raised is not None:
            assert fault is not None, raised
            if not issubclass(fault[1], Exception):
                assert type(raised) is fault[1]  # interrupts propagate as themselves
            else:  # a failed restore or seeding is a DevRNGError; a failed read is the backend's
                assert isinstance(raised, (DevRNGError, fault[1])), repr(raised)
    set_environ(saved_env)


def _nest(ops: list[str], faulty: FaultyBackend, other: FaultyBackend,
          failed_restores: list[tuple[Any, ...]], host: bool = False) -> None:
    """Run ``ops`` nested inside one another, each restoring what it changed. Python's and
    NumPy's generators are drawn from only where an enclosing op covers them (``host``)."""
    if not ops:
        _draw(faulty, other, host)
        return
    op, rest = ops[0], ops[1:]
    devices = ["faulty:0", "other:1", "faulty:1"]

    def inner(covered: bool) -> None:
        _nest(rest, faulty, other, failed_restores, covered)

    def restore(snap: devrng.RNGState) -> None:
        before = generator_states(faulty, other)
        try:
            devrng.set_rng_state(snap)
        except BaseException:
            failed_restores.append(before)
            raise

    if op == "fork":
        with fork_rng(devices=devices):
            inner(host)
    elif op == "fork_host":
        with fork_rng(devices=devices, python=True, numpy=True):
            inner(True)
    elif op in ("snapshot", "seed"):
        # manual_seed seeds every device of a type: the snapshot covers them all.
        snap = devrng.get_rng_state(devices=devices if op == "snapshot" else
                                    ["faulty:0", "faulty:1", "other:0", "other:1"])
        try:
            if op == "seed":
                devrng.manual_seed(11, devices=devices)
            inner(True)
        finally:
            restore(snap)
    elif op == "deterministic":
        with devrng.deterministic(seed=4):
            inner(True)
    else:
        _draw(faulty, other, host)
        inner(host)


def _draw(faulty: FaultyBackend, other: FaultyBackend, host: bool) -> None:
    torch.rand(1)
    for g in faulty.gens[:2] + other.gens[1:2]:  # the devices every op covers
        torch.rand(1, generator=g)
    if host:
        random.random()
        np.random.random()


# ----------------------------------------------------------------------------- interrupts anywhere
# A KeyboardInterrupt injected before every line devrng runs (tests/_interrupts.py), and right
# after every setter applied its change: each call must end all done or all undone, with the
# interrupt going on as itself.
_ENV = ("CUBLAS_WORKSPACE_CONFIG", "TORCHINDUCTOR_DETERMINISTIC", "DEVRNG_SEED")


class _World:
    """Every generator and setting a call could change, to read and to put back by hand."""

    def __init__(self, *holders: Any) -> None:
        self.holders = holders
        self.saved = (torch.get_rng_state(), random.getstate(), np.random.get_state(),
                      [[g.get_state() for g in generators_of(h)] for h in holders], _settings_now()[:-1],
                      {k: os.environ.get(k) for k in _ENV})
        self.start = self.now()

    def now(self) -> tuple[Any, ...]:
        return (generator_states(*self.holders), _settings_now()[:-1],
                tuple(os.environ.get(k) for k in _ENV))

    def reset(self) -> None:
        cpu, py, np_state, devices, flags, env = self.saved
        torch.set_rng_state(cpu)
        random.setstate(py)
        np.random.set_state(np_state)
        for holder, states in zip(self.holders, devices, strict=True):
            for g, state in zip(generators_of(holder), states, strict=True):
                g.set_state(state)
        torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[2:4]
        torch.utils.deterministic.fill_uninitialized_memory = flags[4]
        set_environ(env)

    def result_of(self, op: Callable[[], Any]) -> tuple[Any, ...]:
        """The world after ``op`` runs untouched from the start."""
        self.reset()
        op()
        return self.now()


def _trials(inject: str, op: Callable[[], Any], reset: Callable[[], Any],
            *backends: FaultyBackend) -> Iterator[Any]:
    if inject == "every line":
        return at_every_line(op, reset)
    from tests._internals import fork_module as _fork
    from tests._internals import host as _host

    setters: list[tuple[Any, str]] = [(_host, "set_cpu_state"), (_fork, "set_cpu_state"),
                                      (_host, "seed_cpu"),
                                      (_host, "set_python_state"), (_host, "seed_numpy"),
                                      (np.random, "set_state"), (random, "seed")]
    for backend in backends:
        setters += [(backend, "set_rng_state"), (backend, "manual_seed")]
    return after_every_apply(op, reset, setters)


def _all_or_nothing(trials: Iterator[Any], world: _World, new: tuple[Any, ...], what: str, *,
                    undone_only: bool = False) -> int:
    """Every trial ends at the start or at ``new`` (only at the start when ``undone_only``:
    the caller never received what would undo it), the interrupt raised as itself.
    Returns how many trials were interrupted."""
    interrupted = 0
    for trial in trials:
        end = world.now()
        if trial.injected is None:
            assert trial.raised is None, f"{what}: {trial.raised!r} without an interrupt"
            assert end == new, f"{what}: the uninterrupted run differs"
            continue
        interrupted += 1
        assert trial.raised is trial.injected, (
            f"{what}: interrupted {trial.where}, it raised {trial.raised!r}")
        allowed = (world.start,) if undone_only else (world.start, new)
        assert end in allowed, f"{what}: not all or nothing after an interrupt {trial.where}"
    return interrupted


def _restoring(handles: list[Any], world: _World) -> Callable[[], None]:
    """A reset that restores every handle the last trial made, then the world."""
    def reset() -> None:
        while handles:
            handles.pop().restore()
        world.reset()

    return reset


@pytest.fixture
def world(faulty: FaultyBackend, other: FaultyBackend, clean_env: None) -> Iterator[_World]:
    move_everything(faulty, other)
    w = _World(faulty, other)
    yield w
    w.reset()


INJECT = pytest.mark.parametrize("inject", ["every line", "after every setter"])
_ENOUGH = {"every line": 20, "after every setter": 2}  # trials below this injected nothing real


@INJECT
def test_interrupted_set_rng_state_is_all_or_nothing(world: _World, inject: str) -> None:
    devrng.manual_seed(77)
    snap = devrng.get_rng_state(devices=["faulty:0", "faulty:1", "other:1"])
    op = functools.partial(devrng.set_rng_state, snap)
    new = world.result_of(op)
    assert new != world.start
    assert _all_or_nothing(_trials(inject, op, world.reset, *world.holders), world, new,
                           "set_rng_state") > _ENOUGH[inject]


@INJECT
def test_interrupted_manual_seed_is_all_or_nothing(world: _World, inject: str) -> None:
    op = functools.partial(devrng.manual_seed, 5)
    new = world.result_of(op)
    assert _all_or_nothing(_trials(inject, op, world.reset, *world.holders), world, new,
                           "manual_seed") > _ENOUGH[inject]


def _fork_fast() -> None:
    with fork_rng(devices=[]):
        torch.rand(1)


def _fork_devices() -> None:
    with fork_rng(devices=["faulty:0", "other:1"]):
        torch.rand(1)
        random.random()


@fork_rng(devices=["faulty:0"], python=True, numpy=True)
def _forked_function() -> None:
    torch.rand(1)
    random.random()
    np.random.random()


def _fork_host() -> None:
    with fork_rng(devices=["faulty:1"], python=True, numpy=True):
        _forked_function()  # a fork inside a fork


def _fork_never_entered() -> None:
    fork_rng(devices=["faulty:0"], python=True)  # never entered: freed at once
    with fork_rng(devices=["faulty:1", "other:1"]):  # warns of it, then forks
        torch.rand(1)


@INJECT
@pytest.mark.parametrize("op", [_fork_fast, _fork_devices, _fork_host, _forked_function,
                                _fork_never_entered],
                         ids=["fast path", "devices", "python and numpy", "decorator",
                              "a fork never entered"])
@pytest.mark.filterwarnings("ignore:devrng.fork_rng\\(...\\) was called but never entered")
def test_an_interrupted_fork_restores_everything(world: _World, inject: str,
                                                 op: Callable[[], None]) -> None:
    """Each trial raises its interrupt as itself: one landing while a fork made and never
    entered is freed would be swallowed by Python (as in any finalizer), so none may land
    there -- freeing one runs no Python code of devrng's; the next fork_rng call warns."""
    new = world.result_of(op)
    if op is not _fork_devices:  # which leaves Python's generator out of the fork
        assert new == world.start
    interrupted = _all_or_nothing(_trials(inject, op, world.reset, *world.holders), world, new,
                                  op.__name__)
    assert interrupted > (0 if op is _fork_fast else _ENOUGH[inject])


def _turn_is_free() -> bool:
    """Whether another thread could fork a stream now (no fork left holding its turn)."""
    from tests._internals import streams_module

    def take() -> bool:
        if not streams_module._TURN.acquire(timeout=0):
            return False
        streams_module._TURN.release()
        return True

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(take).result(timeout=10)


@INJECT
def test_an_interrupted_stream_fork_restores_everything_and_gives_back_its_turn(
        world: _World, inject: str) -> None:
    streams = devrng.RNGStreams()
    streams.add("a", 1)

    def op() -> None:
        with streams.fork("a", devices=["faulty:0", "other:1"]):
            torch.rand(1)

    def reset() -> None:
        assert _turn_is_free()
        world.reset()

    new = world.result_of(op)
    assert new == world.start  # the caller's states come back
    interrupted = _all_or_nothing(_trials(inject, op, reset, *world.holders), world, new,
                                  "RNGStreams.fork")
    assert interrupted > _ENOUGH[inject]
    assert _turn_is_free()


@INJECT
def test_interrupted_deterministic_leaves_nothing_without_a_handle(world: _World,
                                                                   inject: str) -> None:
    handles: list[Any] = []
    reset = _restoring(handles, world)

    def op() -> None:
        handles.append(devrng.deterministic(seed=3))

    new = world.result_of(op)
    reset()
    assert new != world.start
    assert _all_or_nothing(_trials(inject, op, reset, *world.holders), world, new,
                           "deterministic()", undone_only=True) > _ENOUGH[inject]
    reset()


@INJECT
def test_interrupted_restore_of_a_handle_is_all_or_nothing(world: _World, inject: str) -> None:
    handles: list[Any] = []
    restoring = _restoring(handles, world)

    def reset() -> None:
        restoring()
        handles.append(devrng.deterministic(seed=3))

    reset()
    applied = world.now()
    interrupted = 0
    for trial in _trials(inject, lambda: handles[-1].restore(), reset, *world.holders):
        end = world.now()
        if trial.injected is None:
            assert trial.raised is None and end == world.start
            continue
        interrupted += 1
        assert trial.raised is trial.injected, (trial.where, trial.raised)
        assert end in (applied, world.start), trial.where
        # Left applied: the handle says so, and restoring it again finishes the job.
        assert handles[-1].active == (end == applied), trial.where
    assert interrupted > _ENOUGH[inject]
    while handles:
        handles.pop().restore()


@INJECT
def test_an_interrupted_with_deterministic_leaves_nothing_applied(world: _World,
                                                                  inject: str) -> None:
    def op() -> None:
        with devrng.deterministic(seed=3):
            move_everything()

    assert _all_or_nothing(_trials(inject, op, world.reset, *world.holders), world, world.start,
                           "with deterministic()") > _ENOUGH[inject]


@INJECT
def test_an_interrupted_training_rng_changes_nothing(world: _World, inject: str) -> None:
    made: list[Any] = []

    def op() -> None:
        made.append(devrng.TrainingRNG(seed=5, deterministic=True))

    def reset() -> None:
        while made:
            rng = made.pop()
            if rng.determinism is not None:
                rng.determinism.restore()
        world.reset()

    new = world.result_of(op)
    reset()
    assert new != world.start
    assert _all_or_nothing(_trials(inject, op, reset, *world.holders), world, new,
                           "TrainingRNG(...)", undone_only=True) > _ENOUGH[inject]
    reset()


class _Noise:
    """A tracked object whose state_dict() holds its live tensor, as a module's would (a
    module itself is refused: its state belongs in the model checkpoint)."""

    def __init__(self) -> None:
        self.scale = torch.ones(3)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"scale": self.scale}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.scale.copy_(state["scale"])


@INJECT
def test_an_interrupted_training_rng_load_is_all_or_nothing(world: _World, inject: str) -> None:
    rng = devrng.TrainingRNG(seed=11)
    loader = torch.utils.data.DataLoader(range(8), shuffle=True, **rng.dataloader_kwargs())
    step = rng.track("step", devrng.seeded_jit(lambda x: x + torch.rand(1), backend="eager"))
    noise = rng.track("noise", _Noise())
    list(loader)
    step(torch.zeros(1))
    saved = rng.state_dict()
    list(loader)
    step(torch.zeros(1))
    with torch.no_grad():
        noise.scale.add_(1)
    world.holders = (*world.holders, loader.generator)
    world.saved = (*world.saved[:3], [*world.saved[3], [loader.generator.get_state()]],
                   *world.saved[4:])
    mine = (step.state_dict(), noise.scale.detach().clone(), rng.seed)

    def reset() -> None:
        world.reset()
        step.load_state_dict(mine[0])
        with torch.no_grad():
            noise.scale.copy_(mine[1])

    def now() -> tuple[Any, ...]:
        return (*world.now(), step.state_dict(), noise.scale.tolist())

    reset()
    start = now()
    op = functools.partial(rng.load_state_dict, saved)
    op()
    new = now()
    assert new != start
    interrupted = 0
    for trial in _trials(inject, op, reset, *world.holders[:2]):
        end = now()
        if trial.injected is None:
            assert trial.raised is None and end == new
            continue
        interrupted += 1
        assert trial.raised is trial.injected, (trial.where, trial.raised)
        assert end in (start, new), f"half loaded after an interrupt {trial.where}"
    assert interrupted > _ENOUGH[inject]


@INJECT
def test_an_interrupted_stream_fork_or_seeded_call_gives_the_caller_its_state_back(
        world: _World, inject: str) -> None:
    streams = devrng.RNGStreams()
    streams.add("a", 1)
    step = devrng.seeded_jit(lambda x: x + torch.rand(1), backend="eager", seed=0)

    def op() -> None:
        with streams.fork("a", devices=["faulty:0", "other:1"]):
            torch.rand(1)
        step(torch.zeros(1), seed=4)

    assert world.result_of(op) == world.start
    assert _all_or_nothing(_trials(inject, op, world.reset, *world.holders), world, world.start,
                           "streams.fork / seeded_jit") > _ENOUGH[inject]


# ----------------------------------------------------------------------------- a real Ctrl-C
# Real SIGINTs from this process, at random moments, into a child running the operation in a
# loop (tests._interrupts.under_real_sigint): CPython takes them at its own check points,
# often the first instruction of an __exit__, where no line of code can guard. Each scenario
# defines reset(), op(i) and check(i) (what is wrong after an interrupt in call i, or "").
_GENERATORS = """
import random, numpy as np, torch, devrng
def gens():
    return (bytes(torch.get_rng_state().numpy()), random.getstate(), repr(np.random.get_state()))
"""
REAL_SIGINT = {
    "fork_rng(devices=[])": _GENERATORS + """
def reset():
    global before
    before = gens()
def op(i):
    with devrng.fork_rng(devices=[]):
        torch.rand(1)
def check(i):
    return "" if gens() == before else "the CPU generator was not put back"
""",
    "fork_rng(python=True, numpy=True)": _GENERATORS + """
def reset():
    global before
    before = gens()
def op(i):
    with devrng.fork_rng(devices=[], python=True, numpy=True):
        torch.rand(1); random.random(); np.random.random()
def check(i):
    return "" if gens() == before else "a generator was not put back"
""",
    "fork_rng never entered": _GENERATORS + """
import warnings
warnings.simplefilter("ignore", devrng.DevRNGWarning)  # said at every call: not counted here
def reset():
    global before
    before = gens()
def op(i):
    devrng.fork_rng(devices=[], python=True)  # never entered: freed at once, noted in C
    with devrng.fork_rng(devices=[]):         # warns of it, then forks
        torch.rand(1)
def check(i):
    return "" if gens() == before else "the CPU generator was not put back"
""",
    "@fork_rng()": _GENERATORS + """
@devrng.fork_rng(devices=[])
def draw():
    torch.rand(1)
def reset():
    global before
    before = gens()
def op(i):
    draw()
def check(i):
    return "" if gens() == before else "the CPU generator was not put back"
""",
    "set_rng_state": _GENERATORS + """
devrng.manual_seed(1); A = devrng.get_rng_state(); GA = gens()
devrng.manual_seed(2); B = devrng.get_rng_state(); GB = gens()
def reset():
    devrng.set_rng_state(A)
def op(i):  # A and B in turn: a half-applied snapshot is neither
    devrng.set_rng_state(B if i % 2 == 0 else A)
def check(i):
    return "" if gens() in (GA, GB) else "half of one snapshot, half of the other"
""",
    "manual_seed": _GENERATORS + """
devrng.manual_seed(1); GA = gens(); devrng.manual_seed(2); GB = gens()
def reset():
    devrng.manual_seed(1)
def op(i):
    devrng.manual_seed(2 if i % 2 == 0 else 1)
def check(i):
    return "" if gens() in (GA, GB) else "half seeded"
""",
    "with deterministic()": _GENERATORS + """
def settings():
    return (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark, torch.utils.deterministic.fill_uninitialized_memory)
START = settings()
def reset():
    global before
    before = gens()
def op(i):
    with devrng.deterministic(seed=3):
        torch.rand(1)
def check(i):
    if settings() != START:
        return "determinism left on"
    return "" if gens() == before else "the seeding was not undone"
""",
    "RNGStreams.fork": _GENERATORS + """
streams = devrng.RNGStreams()
streams.add("a", 1)
def reset():
    global before
    before = gens()
def op(i):
    with streams.fork("a", devices=[]):
        torch.rand(1)
def check(i):
    try:
        with streams.fork("a", devices=[]):
            pass
    except RuntimeError as err:
        return f"the stream cannot be forked again: {err}"
    return "" if gens() == before else "the caller's generator was not put back"
""",
    "patch_torch / unpatch_torch": """
import torch, devrng
original = torch.random.fork_rng
def reset():
    devrng.unpatch_torch()
def op(i):
    devrng.patch_torch() if i % 2 == 0 else devrng.unpatch_torch()
def check(i):
    devrng.unpatch_torch()  # whatever the interrupt left, unpatching must repair it
    return "" if torch.random.fork_rng is original else "unpatch_torch cannot undo the patch"
""",
    "TrainingRNG.load_state_dict": _GENERATORS + """
rng = devrng.TrainingRNG(seed=1)
torch.rand(3)
A, GA = rng.state_dict(), gens()
torch.rand(3)
B, GB = rng.state_dict(), gens()
def reset():
    rng.load_state_dict(A)
def op(i):
    rng.load_state_dict(B if i % 2 == 0 else A)
def check(i):
    return "" if gens() in (GA, GB) else "half loaded"
""",
    "TrainingRNG.state_dict": _GENERATORS + """
import io
rng = devrng.TrainingRNG(seed=1)
torch.rand(3)
before = gens()
def reset():
    global saved
    saved = None
def op(i):  # reads only: the generators must not move, and a state returned must be whole
    global saved
    saved = rng.state_dict()
def check(i):
    if gens() != before:
        return "the generators moved"
    if saved is not None:
        data = torch.load(io.BytesIO(next(iter(saved.values()))), weights_only=True)
        if data["format"] != "devrng.TrainingRNG":
            return "the state is not whole"
    return ""
""",
    "RNGState.save": """
import os, tempfile, torch, devrng
folder = tempfile.mkdtemp()
path = os.path.join(folder, "state.rng")
A = devrng.get_rng_state()
torch.rand(1)
B = devrng.get_rng_state()
def reset():
    A.save(path)
def op(i):  # A and B in turn: the file must always hold one of them, whole
    (B if i % 2 == 0 else A).save(path)
def check(i):
    left = sorted(os.listdir(folder))
    if left != ["state.rng"]:
        return f"files left behind: {left}"
    try:
        loaded = devrng.RNGState.load(path)
    except devrng.DevRNGError as err:
        return f"the file is damaged: {err}"
    return "" if loaded in (A, B) else "the file holds neither snapshot"
""",
    "seeded_jit(backend='inductor')": """
import torch, devrng
step = devrng.seeded_jit(lambda x: torch.nn.functional.dropout(x, 0.5), backend="inductor",
                         seed=0)
x = torch.ones(8)
def reset():
    global before
    before = torch.get_rng_state()
def op(i):
    step(x, seed=i)
def check(i):
    return "" if torch.equal(torch.get_rng_state(), before) else "the caller's generator moved"
""",
}
# Default run: enough interrupts that the controls below fail for certain; `-m slow`: many
# more (about 24,000 over the scenarios), with time to land them on a loaded machine.
_REAL = [pytest.param(n, 200, id=n) for n in REAL_SIGINT] + [
    pytest.param(n, 2000, id=f"{n}-many", marks=pytest.mark.slow) for n in REAL_SIGINT]


@pytest.mark.parametrize(("scenario", "interrupts"), _REAL)
def test_a_real_ctrl_c_leaves_every_call_whole_and_goes_on_as_itself(
        scenario: str, interrupts: int) -> None:
    stats = under_real_sigint(REAL_SIGINT[scenario], interrupts=interrupts,
                              seconds=max(120, interrupts * 0.4))
    assert stats["interrupts"] >= interrupts, stats
    assert stats["bad"] == [], f"{len(stats['bad'])} of {stats['interrupts']}: {stats['bad'][:5]}"
    assert stats["swallowed"] == 0, stats


@pytest.mark.parametrize("control", ["torch.random.fork_rng", "DEVRNG_DEFER_SIGINT=0"])
def test_the_real_ctrl_c_harness_catches_a_fork_that_restores_nothing(control: str) -> None:
    # The same fork scenario where a Ctrl-C can be taken before __exit__'s first line: with
    # torch's own fork_rng, and with devrng's under Python's own SIGINT handler.
    setup = REAL_SIGINT["fork_rng(devices=[])"]
    env: dict[str, str | None] = {}
    if control == "torch.random.fork_rng":
        setup = setup.replace("devrng.fork_rng", "torch.random.fork_rng")
    else:
        env["DEVRNG_DEFER_SIGINT"] = "0"
    stats = under_real_sigint(setup, interrupts=400, env=env)
    assert len(stats["bad"]) > 0, stats


def test_devrngs_sigint_handler_is_installed_only_over_pythons_own() -> None:
    code = """
        import signal, threading
        def mine(signum, frame): pass
        signal.signal(signal.SIGINT, mine)
        import devrng                       # a program's own handler stays
        assert signal.getsignal(signal.SIGINT) is mine
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from tests._internals import sigint
        sigint.install()                   # over Python's own: devrng's
        assert sigint.installed()
        try:
            signal.raise_signal(signal.SIGINT)   # outside devrng: raised at once, as always
        except KeyboardInterrupt:
            print("raised")
    """
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["raised"]
    off = run_python("import signal, devrng; "
                     "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)",
                     env={"DEVRNG_DEFER_SIGINT": "0"})
    assert off.stdout.strip() == "True"


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("kind", "L" * 50_000, "'LLLL"),
    ("sampler_args", {"seed": ["a", "b"]}, r"\['a', 'b'\]"),
    ("batch_size", {"nested": 1}, r"\{'nested': 1\}"),
])
def test_a_loader_record_devrng_cannot_have_written_is_refused_in_a_short_sentence(
        field: str, value: Any, shown: str) -> None:
    rng = devrng.TrainingRNG(seed=1)
    rng.track("loader", torch.utils.data.DataLoader(range(8), batch_size=2))
    saved = plain_state(rng.state_dict())
    saved["loaders"]["loader"][field] = value
    before = generator_states()
    with pytest.raises(DevRNGError, match=f"The saved record of the loader 'loader' holds {shown}"
                                          ) as caught:
        rng.load_state_dict(resealed(saved))
    assert len(str(caught.value)) < 400  # a saved value is quoted by a short prefix only
    assert generator_states() == before

"""RNGStreams: named streams on the CPU, SIMULATED CUDA and real XLA (xla env)."""

from __future__ import annotations

import _thread
import io
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from tests._helpers import plain_state, resealed
from tests._internals import streams_module

import devrng
from devrng import DevRNGError, RNGStreams


def _roundtrip(sd: dict[str, Any]) -> Any:
    """Through a file that only weights-only loading reads."""
    buffer = io.BytesIO()
    torch.save(sd, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


# The same program runs uninterrupted here, and saved then resumed in a fresh process.
RESUME = r'''
import json, sys
import torch, devrng

def run(mode, device, path):
    if device == "xla":
        import torch_xla
        dev = torch_xla.device()
    else:
        dev = torch.device("cpu")

    def step(streams):
        with streams.fork("dropout", devices=[dev]):
            a = torch.rand(3, device=dev)
        with streams.fork("other", devices=[dev]):
            b = torch.rand(1, device=dev)
        c = torch.rand(2, device=dev)  # the default stream, between forks
        return torch.cat([a, b, c]).cpu().tolist()

    if mode == "resume":
        ckpt = torch.load(path, weights_only=True)
        streams = devrng.RNGStreams()
        streams.load_state_dict(ckpt["streams"])
        devrng.set_rng_state(devrng.RNGState.from_dict(ckpt["rng"]))
        return [step(streams) for _ in range(3)]
    devrng.manual_seed(0)
    streams = devrng.RNGStreams()
    streams.add("dropout", 42)
    streams.add("other", 43)
    out = [step(streams) for _ in range(3)]
    if mode == "save":
        torch.save({"streams": streams.state_dict(),
                    "rng": devrng.get_rng_state(devices=[dev]).to_dict()}, path)
        return out
    return out + [step(streams) for _ in range(3)]
'''


def _check_resume(device: str, tmp_path: Path) -> None:
    ns: dict[str, Any] = {}
    exec(RESUME, ns)
    path = str(tmp_path / "ckpt.pt")
    full = ns["run"]("full", device, path)
    first = ns["run"]("save", device, path)
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    code = RESUME + "\nprint(json.dumps(run(*sys.argv[1:])))"
    proc = subprocess.run([sys.executable, "-c", code, "resume", device, path], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rest = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first + rest == full
    assert full[0] != full[3]  # the streams advanced: the test can tell steps apart


# -- CPU ----------------------------------------------------------------------------------
def test_cpu_fork_does_not_disturb_the_default_stream() -> None:
    streams = RNGStreams()
    streams.add("dropout", 1)
    torch.manual_seed(0)
    expected = torch.rand(5)
    torch.manual_seed(0)
    with streams.fork("dropout"):
        inside = torch.rand(7)
    assert torch.equal(torch.rand(5), expected)
    assert not torch.equal(inside[:5], expected)


def test_cpu_same_seeds_give_the_same_draws_whatever_the_default_stream() -> None:
    def run(default_seed: int) -> list[torch.Tensor]:
        torch.manual_seed(default_seed)
        streams = RNGStreams()
        streams.add("a", 10)
        streams.add("b", 11)
        out = []
        for name in ("a", "b", "a", "a", "b"):
            with streams.fork(name):
                out.append(torch.rand(3))
            out.append(torch.rand(1))  # default stream draws in between
        return out[0::2]

    first, second = run(0), run(999)
    assert all(torch.equal(x, y) for x, y in zip(first, second, strict=True))


def test_cpu_streams_are_independent_of_each_other_and_of_the_default() -> None:
    streams = RNGStreams()
    streams.add("a", 5)
    streams.add("b", 5)
    with streams.fork("a"):
        a = torch.rand(8)
    with streams.fork("b"):
        b = torch.rand(8)
    devrng.manual_seed(5)
    default = torch.rand(8)
    assert not torch.equal(a, b)
    assert not torch.equal(a, default)
    assert not torch.equal(b, default)


def test_cpu_fork_continues_where_it_stopped() -> None:
    s1, s2 = RNGStreams(), RNGStreams()
    s1.add("x", 3)
    s2.add("x", 3)
    with s1.fork("x"):
        first = torch.rand(3)
    torch.rand(10)  # the default stream moving does not matter
    with s1.fork("x"):
        second = torch.rand(3)
    with s2.fork("x"):
        together = torch.rand(6)
    assert torch.equal(torch.cat([first, second]), together)


def test_cpu_exception_inside_fork_restores_the_caller_and_keeps_the_stream() -> None:
    streams, twin = RNGStreams(), RNGStreams()
    streams.add("x", 3)
    twin.add("x", 3)
    before = torch.get_rng_state()

    def fail() -> None:
        with streams.fork("x"):
            torch.rand(4)
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        fail()
    assert torch.equal(torch.get_rng_state(), before)
    with streams.fork("x"):
        after = torch.rand(2)
    with twin.fork("x"):
        expected = torch.rand(6)[4:]
    assert torch.equal(after, expected)


def test_cpu_nested_forks_of_different_streams() -> None:
    streams, ref = RNGStreams(), RNGStreams()
    for s in (streams, ref):
        s.add("outer", 1)
        s.add("inner", 2)
    before = torch.get_rng_state()
    with streams.fork("outer"):
        o1 = torch.rand(2)
        with streams.fork("inner"):
            i1 = torch.rand(2)
        o2 = torch.rand(2)
    assert torch.equal(torch.get_rng_state(), before)
    with ref.fork("outer"):
        assert torch.equal(torch.cat([o1, o2]), torch.rand(4))
    with ref.fork("inner"):
        assert torch.equal(i1, torch.rand(2))


def test_cpu_fork_works_as_a_decorator() -> None:
    streams = RNGStreams()
    streams.add("x", 3)

    @streams.fork("x")
    def draw() -> torch.Tensor:
        return torch.rand(2)

    before = torch.get_rng_state()
    a, b = draw(), draw()
    assert not torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), before)


def test_cpu_state_dict_round_trip_is_weights_only_and_resumes() -> None:
    streams, twin = RNGStreams(), RNGStreams()
    for s in (streams, twin):
        s.add("a", 1)
        s.add("b", 2)
    with streams.fork("a"):
        torch.rand(3)
    restored = RNGStreams()
    restored.load_state_dict(_roundtrip(streams.state_dict()))
    assert restored.names == ("a", "b")
    assert restored.seed("b") == 2
    with restored.fork("a"):
        got = torch.rand(2)
    with twin.fork("a"):
        expected = torch.rand(5)[3:]
    assert torch.equal(got, expected)


def test_cpu_resume_in_a_fresh_process_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    _check_resume("cpu", tmp_path)


# -- errors ----------------------------------------------------------------------------------
def _forked_draws(seed: int, rounds: int, start: threading.Barrier | None = None) -> list[float]:
    """What ``rounds`` forks of a stream of its own draw, two draws per fork with a pause
    between them (where another thread's fork would swap its state in)."""
    streams = RNGStreams()
    streams.add("own", seed)
    if start is not None:
        start.wait()
    drawn: list[float] = []
    for _ in range(rounds):
        with streams.fork("own", devices=[]):
            drawn += torch.rand(2).tolist()
            time.sleep(0.001)
            drawn += torch.rand(2).tolist()
    return drawn


def test_threads_forking_streams_of_their_own_each_draw_their_own_numbers() -> None:
    # Before: the CPU generator is one per process, and one thread's fork swapped its
    # stream in while another thread drew inside its own fork (7 of 8 threads got others'
    # numbers). Forks now take turns across threads.
    seeds = range(8)
    want = {seed: _forked_draws(seed, 20) for seed in seeds}
    start = threading.Barrier(len(seeds))
    with ThreadPoolExecutor(len(seeds)) as pool:
        got = dict(zip(seeds, pool.map(lambda s: _forked_draws(s, 20, start), seeds), strict=True))
    assert got == want
    # One thread's forks still nest, and other threads go on once they exit.
    streams = RNGStreams()
    streams.add("a", 1)
    streams.add("b", 2)
    with ThreadPoolExecutor(1) as pool:
        with streams.fork("a", devices=[]), streams.fork("b", devices=[]):
            other = pool.submit(_forked_draws, 3, 1)
            time.sleep(0.1)
            assert not other.done()  # waiting for this thread's forks
        assert other.result(timeout=10) == _forked_draws(3, 1)


def _hold_a_fork(entered: threading.Event, leave: threading.Event) -> None:
    streams = RNGStreams()
    streams.add("held", 1)
    with streams.fork("held", devices=[]):
        entered.set()
        leave.wait(10)


def test_a_fork_waiting_for_another_threads_warns_and_takes_a_ctrl_c(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams_module, "_PATIENCE", 0.2)
    entered, leave = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_a_fork, args=(entered, leave), name="holder")
    holder.start()
    entered.wait(10)
    streams = RNGStreams()
    streams.add("mine", 2)
    try:
        # The holder leaves after 0.5 s: this fork warns at 0.2 s, then goes on.
        threading.Timer(0.5, leave.set).start()
        with pytest.warns(devrng.DevRNGWarning, match=r"RNGStreams.fork: thread 'MainThread''s "
                          r"fork of 'mine' has waited 0.2 s for thread 'holder''s fork of "
                          r"'held' to exit: .* forks in different threads take turns"):
            with streams.fork("mine", devices=[]):
                pass
        holder.join(10)
        # A Ctrl-C while waiting is raised at once, and leaves nothing held.
        entered.clear()
        leave.clear()
        holder = threading.Thread(target=_hold_a_fork, args=(entered, leave), name="holder")
        holder.start()
        entered.wait(10)
        threading.Timer(0.2, _thread.interrupt_main).start()
        with pytest.raises(KeyboardInterrupt):
            with streams.fork("mine", devices=[]):
                pytest.fail("the fork was entered")
    finally:
        leave.set()
        holder.join(10)
    with ThreadPoolExecutor(1) as pool:  # the turn is free: another thread forks at once
        assert pool.submit(_forked_draws, 3, 1).result(timeout=5) == _forked_draws(3, 1)


def test_adding_a_name_twice_is_a_value_error() -> None:
    streams = RNGStreams()
    streams.add("dropout", 1)
    with pytest.raises(ValueError, match=r"A stream named 'dropout' already exists \(seed 1\)"):
        streams.add("dropout", 2)


def test_forking_an_unknown_name_lists_the_known_ones() -> None:
    streams = RNGStreams()
    with pytest.raises(ValueError, match=r"no stream named 'x'; the streams are: none yet"):
        with streams.fork("x"):
            pass
    streams.add("a", 1)
    streams.add("b", 1)
    with pytest.raises(ValueError, match=r"no stream named 'c'; the streams are: 'a', 'b'\."):
        with streams.fork("c"):
            pass


@pytest.mark.parametrize(("name", "seed", "exc", "match"), [
    ("a", -1, ValueError, r"seed=-1 is out of range"),
    ("a", 1.0, TypeError, r"seed must be an int"),
    ("", 1, TypeError, r"stream name must be a non-empty string, not ''"),
    (3, 1, TypeError, r"stream name must be a non-empty string, not 3"),
])
def test_add_rejects_bad_arguments(name: Any, seed: Any, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        RNGStreams().add(name, seed)


def test_forking_a_stream_inside_itself_is_refused() -> None:
    streams = RNGStreams()
    streams.add("x", 1)
    before = torch.get_rng_state()
    with pytest.raises(RuntimeError, match=r"RNGStreams.fork\('x'\) is already active"):
        with streams.fork("x"), streams.fork("x"):
            pass
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda sd: sd.update(format="other"), r"takes the dict that RNGStreams.state_dict\(\) returns"),
    (lambda sd: sd.update(version=99), r"version 99; this devrng reads versions 1, 2"),
    (lambda sd: sd["streams"]["a"].update(cpu=torch.zeros(3)), r"Stream 'a''s CPU state is a torch.float32 tensor of shape \(3,\); this torch needs a uint8 "
     r"CPU tensor"),
    (lambda sd: sd["streams"]["a"].pop("seed"), r"Stream 'a' in the RNGStreams state dict is malformed"),
    (lambda sd: sd["streams"]["a"].update(seed=-5), r"seed=-5 is out of range"),
])
def test_load_state_dict_checks_everything_and_changes_nothing_on_error(mutate: Any,
                                                                        match: str) -> None:
    streams = RNGStreams()
    streams.add("a", 1)
    sd = plain_state(streams.state_dict())
    mutate(sd)
    target = RNGStreams()
    target.add("keep", 9)
    with pytest.raises(DevRNGError, match=match):  # sealed again: the check behind the digest
        target.load_state_dict(resealed(sd))
    assert target.names == ("keep",)
    with pytest.raises(DevRNGError, match=r"altered or damaged|format tag|version 99"):
        target.load_state_dict(sd)  # as changed, under the digest written before
    assert target.names == ("keep",)


# -- SIMULATED CUDA ----------------------------------------------------------------------------
def test_simulated_cuda_fork_uses_the_stream_and_leaves_every_device_alone(
        simulate_device: Any) -> None:
    fake = simulate_device("cuda", count=2)
    streams = RNGStreams()
    streams.add("tp", 7)
    states = [g.get_state() for g in fake.generators]
    with streams.fork("tp", devices=["cuda:1"]):
        inside = fake.draw(1)
    # Creating the stream's cuda:1 state seeded all devices; every one was put back.
    assert all(torch.equal(g.get_state(), s) for g, s in zip(fake.generators, states, strict=True))
    # The draw came from the stream, not from cuda:1's default generator ...
    assert not torch.equal(inside, fake.draw(1))
    # ... and the same seed gives the same draws on a fresh simulated device.
    fake2 = simulate_device("cuda", count=2)
    again = RNGStreams()
    again.add("tp", 7)
    with again.fork("tp", devices=["cuda:1"]):
        assert torch.equal(fake2.draw(1), inside)


def test_simulated_cuda_accelerator_is_covered_by_default(simulate_device: Any) -> None:
    fake = simulate_device("cuda", count=1, accelerator=True)
    streams = RNGStreams()
    streams.add("a", 5)
    torch.cuda.manual_seed_all(5)
    default = fake.draw(0, 8)
    with streams.fork("a"):
        inside = fake.draw(0, 8)
        cpu_inside = torch.rand(2)
    assert not torch.equal(inside, default)  # independent of a default stream with the seed 5
    assert fake.set_calls  # the fork really swapped the device state
    with streams.fork("a"):
        fake.draw(0, 1)
        assert not torch.equal(torch.rand(2), cpu_inside)  # CPU continued, too


def test_simulated_cuda_state_dict_resumes_on_a_fresh_device(simulate_device: Any) -> None:
    fake = simulate_device("cuda", count=2)
    streams, twin = RNGStreams(), RNGStreams()
    for s in (streams, twin):
        s.add("tp", 11)
    with streams.fork("tp", devices=["cuda:0", "cuda:1"]):
        fake.draw(0)
        fake.draw(1)
    sd = plain_state(_roundtrip(streams.state_dict()))
    assert set(sd["streams"]["tp"]["devices"]["cuda"]) == {0, 1}
    fresh = simulate_device("cuda", count=2)  # as a new process would have it
    restored = RNGStreams()
    restored.load_state_dict(sd)
    with restored.fork("tp", devices=["cuda:0", "cuda:1"]):
        got = (fresh.draw(0), fresh.draw(1))
    twin_fake = simulate_device("cuda", count=2)
    with twin.fork("tp", devices=["cuda:0", "cuda:1"]):
        twin_fake.draw(0)
        twin_fake.draw(1)
        expected = (twin_fake.draw(0), twin_fake.draw(1))
    assert torch.equal(got[0], expected[0])
    assert torch.equal(got[1], expected[1])


def test_simulated_cuda_failed_swap_puts_everything_back(simulate_device: Any) -> None:
    fake = simulate_device("cuda", count=1)
    streams = RNGStreams()
    streams.add("a", 1)
    with streams.fork("a", devices=["cuda:0"]):
        pass
    cpu = torch.get_rng_state()
    fake.fail_set = True
    with pytest.raises(devrng.DevRNGError, match=r"could not put the stream's cuda:0 state"):
        with streams.fork("a", devices=["cuda:0"]):
            pass
    assert torch.equal(torch.get_rng_state(), cpu)


# -- real XLA (xla env) ----------------------------------------------------------------------------
@pytest.fixture
def xla_device() -> Any:
    pytest.importorskip("torch_xla")
    import torch_xla

    dev = torch_xla.device()
    with devrng.fork_rng(devices=[dev]):  # leave XLA's default stream as it was
        yield dev


@pytest.mark.xla
def test_xla_fork_does_not_disturb_the_default_stream(xla_device: Any) -> None:
    streams = RNGStreams()
    streams.add("dropout", 1)
    devrng.manual_seed(0)
    expected = torch.rand(5, device=xla_device).cpu()
    devrng.manual_seed(0)
    with streams.fork("dropout", devices=[xla_device]):
        inside = torch.rand(5, device=xla_device).cpu()
    assert torch.equal(torch.rand(5, device=xla_device).cpu(), expected)
    assert not torch.equal(inside, expected)


@pytest.mark.xla
def test_xla_same_seeds_give_the_same_draws(xla_device: Any) -> None:
    def run(default_seed: int) -> torch.Tensor:
        devrng.manual_seed(default_seed)
        streams = RNGStreams()
        streams.add("dropout", 42)
        with streams.fork("dropout", devices=["xla:0"]):
            a = torch.rand(4, device=xla_device)
        torch.rand(4, device=xla_device)
        with streams.fork("dropout", devices=["xla:0"]):
            b = torch.rand(4, device=xla_device)
        return torch.cat([a, b]).cpu()

    first = run(0)
    assert torch.equal(first, run(123))
    assert not torch.equal(first[:4], first[4:])


@pytest.mark.xla
def test_xla_resume_in_a_fresh_process_matches_an_uninterrupted_run(xla_device: Any,
                                                                   tmp_path: Path) -> None:
    _check_resume("xla", tmp_path)

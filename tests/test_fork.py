"""fork_rng: the drop-in for torch.random.fork_rng (CPU real, other devices SIMULATED here;
real XLA / torchax cases are in test_fork_xla.py)."""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from tests._fakes import MinimalBackend, fake_tensor, registered

import devrng
from devrng import DevRNGError, fork_rng


def test_cpu_state_is_restored_like_torch() -> None:
    before = torch.get_rng_state()
    with fork_rng(devices=[]):
        torch.rand(100)
    assert torch.equal(torch.get_rng_state(), before)
    with torch.random.fork_rng(devices=[]):  # the peer behaves the same on the CPU
        torch.rand(100)
    assert torch.equal(torch.get_rng_state(), before)


def test_draws_inside_equal_draws_after() -> None:
    with fork_rng(devices=[]):
        inside = torch.rand(5)
    assert torch.equal(inside, torch.rand(5))


def test_disabled_does_not_fork() -> None:
    before = torch.get_rng_state()
    with fork_rng(devices=[], enabled=False):
        torch.rand(3)
    assert not torch.equal(torch.get_rng_state(), before)


def test_meta_device_type_forks_nothing_like_torch() -> None:
    before = torch.get_rng_state()
    with fork_rng(device_type="meta"):
        torch.rand(3)
    assert not torch.equal(torch.get_rng_state(), before)


def test_python_and_numpy_are_forked_on_request() -> None:
    py, npst = random.getstate(), np.random.get_state()
    with fork_rng(devices=[], python=True, numpy=True):
        random.random()
        np.random.rand(3)
    assert random.getstate() == py
    after = np.random.get_state()
    assert np.array_equal(after[1], npst[1]) and after[2] == npst[2]


def test_python_and_numpy_are_left_alone_by_default() -> None:
    py = random.getstate()
    with fork_rng(devices=[]):
        random.random()
    assert random.getstate() != py


def test_numpy_cached_gaussian_is_restored() -> None:
    np.random.seed(3)
    np.random.standard_normal()  # leaves a cached second gaussian
    with fork_rng(devices=[], numpy=True):
        np.random.standard_normal()
        np.random.standard_normal()
    expected = np.random.standard_normal()
    np.random.seed(3)
    np.random.standard_normal()
    assert np.random.standard_normal() == expected


def test_decorator_forks_every_call() -> None:
    @fork_rng(devices=[])
    def draw() -> torch.Tensor:
        return torch.rand(3)

    first = draw()
    assert torch.equal(first, draw())
    assert torch.equal(first, torch.rand(3))
    assert draw.__name__ == "draw"


def test_bare_decorator_without_parentheses_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"write @fork_rng\(\) with parentheses"):
        fork_rng(lambda: None)


def test_same_object_nests_and_recurses() -> None:
    cm = fork_rng(devices=[])
    before = torch.get_rng_state()
    with cm:
        torch.rand(1)
        mid = torch.get_rng_state()
        with cm:
            torch.rand(1)
        assert torch.equal(torch.get_rng_state(), mid)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("kwargs", [{"devices": []}, {"devices": [], "python": True}],
                         ids=["the CPU fork", "any other fork"])
def test_forks_exited_out_of_order_say_so(kwargs: dict[str, Any]) -> None:
    """An outer fork exited while an inner one is open (ExitStack misuse, hand-written
    __enter__/__exit__, concurrent tasks): each puts back what it saw at its own entry, so
    the generators end as at the inner fork's entry. torch says nothing; devrng warns."""
    outer, inner = fork_rng(**kwargs), fork_rng(**kwargs)
    before = torch.get_rng_state()
    outer.__enter__()
    torch.rand(1)
    at_inner = torch.get_rng_state()
    inner.__enter__()
    torch.rand(1)
    with pytest.warns(devrng.DevRNGWarning, match=r"a fork was exited while 1 fork\(s\) entered "
                      r"after it in this thread are still open.*Exit forks newest first") as said:
        outer.__exit__(None, None, None)
    assert [w.filename for w in said] == [__file__]
    assert torch.equal(torch.get_rng_state(), before)  # the outer one did its part
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inner.__exit__(None, None, None)  # the newest open one now: nothing to say
        assert torch.equal(torch.get_rng_state(), at_inner)  # what the warning said
        with outer, inner:  # in order, afterwards: quiet
            torch.rand(1)
        assert torch.equal(torch.get_rng_state(), at_inner)


def test_interleaved_async_forks_say_so() -> None:
    """docs/guarantees.md: two coroutines whose @fork_rng() forks interleave exit them out
    of order (the first to finish was entered first): the generators end as the second saw
    them at its entry, and devrng warns."""
    import asyncio

    @fork_rng(devices=[])
    async def draw(delay: float) -> torch.Tensor:
        await asyncio.sleep(delay)
        return torch.rand(1)

    async def both() -> None:
        await asyncio.gather(draw(0.01), draw(0.05))

    with pytest.warns(devrng.DevRNGWarning, match=r"exited while 1 fork\(s\) entered after it"):
        asyncio.run(both())


def test_forks_in_other_threads_do_not_count_as_out_of_order() -> None:
    import threading

    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with fork_rng(devices=[]):
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mine = fork_rng(devices=[])
        mine.__enter__()
        thread.start()
        assert entered.wait(10)
        mine.__exit__(None, None, None)  # the other thread's fork is still open
        release.set()
        thread.join(10)


def test_generator_devices_argument_is_listed_once(simulate_device: Any) -> None:
    x = fake_tensor("xpu:1")
    xpu = simulate_device("xpu", count=2)  # SIMULATED
    snap = xpu.generators[1].get_state()
    seen = (t for t in [x])  # a second pass over a generator would find nothing
    with fork_rng(devices=seen):
        xpu.draw(1)
    assert torch.equal(xpu.generators[1].get_state(), snap)


# -- device types: SIMULATED devices ---------------------------------------------------

def test_simulated_xpu_tensor_is_forked_where_torch_forks_cuda(simulate_device: Any) -> None:
    x = fake_tensor("xpu:1")  # a tensor whose .device is xpu:1 (made before xpu "exists")
    xpu = simulate_device("xpu", count=2)
    snap = xpu.generators[1].get_state()
    with fork_rng(devices=[x]):
        inside = xpu.draw(1)
        torch.rand(2)
    assert torch.equal(xpu.generators[1].get_state(), snap)
    assert torch.equal(inside, xpu.draw(1))
    assert xpu.set_calls == [1]  # only the device named, xpu:1


def test_torch_fork_rng_misses_simulated_xpu_when_cuda_is_the_default(simulate_device: Any) -> None:
    """The bug devrng fixes: torch <= 2.12 forks 'cuda' whatever the devices are."""
    xpu = simulate_device("xpu", count=1)
    simulate_device("cuda", count=1)
    snap = xpu.generators[0].get_state()
    with torch.random.fork_rng(devices=[0], device_type="cuda"):
        xpu.draw(0)
    assert not torch.equal(xpu.generators[0].get_state(), snap)  # torch: XPU not restored
    xpu.generators[0].set_state(snap)
    with fork_rng(devices=["xpu:0"]):
        xpu.draw(0)
    assert torch.equal(xpu.generators[0].get_state(), snap)  # devrng: restored


def test_one_fork_restores_simulated_xpu_and_cuda_together(simulate_device: Any) -> None:
    xpu = simulate_device("xpu", count=2)
    cuda = simulate_device("cuda", count=2)
    states = [g.get_state() for g in xpu.generators + cuda.generators]
    cpu = torch.get_rng_state()
    with fork_rng(devices=["xpu:0", "xpu:1", torch.device("cuda", 1), "cuda:0"]):
        for i in range(2):
            xpu.draw(i)
            cuda.draw(i)
        torch.rand(2)
    assert all(torch.equal(g.get_state(), s)
               for g, s in zip(xpu.generators + cuda.generators, states, strict=True))
    assert torch.equal(torch.get_rng_state(), cpu)


def test_device_type_sequence_forks_all_devices_of_each(simulate_device: Any) -> None:
    xpu = simulate_device("xpu", count=1)
    cuda = simulate_device("cuda", count=1)
    before = (xpu.generators[0].get_state(), cuda.generators[0].get_state())
    with fork_rng(device_type=["xpu", "cuda"]):
        xpu.draw(0)
        cuda.draw(0)
    assert torch.equal(xpu.generators[0].get_state(), before[0])
    assert torch.equal(cuda.generators[0].get_state(), before[1])


def test_int_indices_belong_to_the_explicit_device_type(simulate_device: Any) -> None:
    xpu = simulate_device("xpu", count=3)
    with fork_rng(devices=[2], device_type="xpu"):
        pass
    assert xpu.set_calls == [2]


def test_int_indices_belong_to_the_single_inferred_type(simulate_device: Any) -> None:
    cuda = simulate_device("cuda", count=3)
    with fork_rng(devices=["cuda:0", 2]):
        pass
    assert sorted(cuda.set_calls) == [0, 2]


def test_int_indices_default_to_the_current_accelerator(simulate_device: Any) -> None:
    xpu = simulate_device("xpu", count=2, accelerator=True)
    with fork_rng(devices=[1]):
        xpu.draw(1)
    assert xpu.set_calls == [1]


def test_ambiguous_int_indices_are_an_error(simulate_device: Any) -> None:
    simulate_device("xpu", count=2)
    simulate_device("cuda", count=2)
    with pytest.raises(ValueError, match=r"bare indices \[1\] but several device types"), \
            fork_rng(devices=["xpu:0", "cuda:0", 1]):
        pass


def test_index_out_of_range_is_an_error(simulate_device: Any) -> None:
    simulate_device("xpu", count=2)
    with pytest.raises(ValueError, match=r"Device xpu:5 does not exist: this process has 2 xpu"), \
            fork_rng(devices=["xpu:5"]):
        pass


def test_many_devices_warning_has_torch_text() -> None:
    # A device type of this test's own, so that no earlier test has used up its one warning.
    with registered("manydev", MinimalBackend(count=2, name="manydev")):
        with pytest.warns(UserWarning, match=r"^MANYDEV reports that you have 2 available "
                          r"devices, and you have used fork_rng without explicitly specifying"), \
                fork_rng(device_type="manydev"):
            pass
        with warnings.catch_warnings():  # once per device type, as torch warns once
            warnings.simplefilter("error")
            with fork_rng(device_type="manydev"):
                pass


def test_bare_fork_does_not_initialise_an_unused_accelerator(simulate_device: Any) -> None:
    """pytorch/pytorch#41970: forking must not initialise a device nobody used."""
    cuda = simulate_device("cuda", count=2, accelerator=True, initialized=False)
    with fork_rng():
        torch.rand(1)
    assert cuda.init_calls == 0 and not cuda.initialized


def test_bare_fork_forks_an_initialised_accelerator(simulate_device: Any) -> None:
    cuda = simulate_device("cuda", count=1, accelerator=True)
    snap = cuda.generators[0].get_state()
    with fork_rng():
        cuda.draw(0)
    assert torch.equal(cuda.generators[0].get_state(), snap)


def test_naming_a_device_type_forks_it_even_if_uninitialised(simulate_device: Any) -> None:
    cuda = simulate_device("cuda", count=1, initialized=False)
    with fork_rng(device_type="cuda"):
        cuda.draw(0)
    assert cuda.set_calls == [0]


def test_failure_restoring_one_generator_does_not_stop_the_others(simulate_device: Any) -> None:
    xpu = simulate_device("xpu", count=1)
    cuda = simulate_device("cuda", count=1)
    cuda_snap, cpu_snap = cuda.generators[0].get_state(), torch.get_rng_state()
    def body() -> None:
        with fork_rng(devices=["xpu:0", "cuda:0"]):
            cuda.draw(0)
            torch.rand(3)
            xpu.fail_set = True

    with pytest.raises(DevRNGError, match=r"could not restore 1 generator\(s\): xpu:0 "
                       r"\(RuntimeError: simulated xpu failure"):
        body()
    assert torch.equal(cuda.generators[0].get_state(), cuda_snap)
    assert torch.equal(torch.get_rng_state(), cpu_snap)


def test_body_exception_survives_a_restore_failure_as_context(simulate_device: Any) -> None:
    xpu = simulate_device("xpu", count=1)
    def body() -> None:
        with fork_rng(devices=["xpu:0"]):
            xpu.fail_set = True
            raise KeyError("body")

    with pytest.raises(DevRNGError) as info:
        body()
    assert isinstance(info.value.__context__, KeyError)


def test_bad_device_type_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"device_type=3 \(a int\) is not accepted"):
        fork_rng(device_type=3).__enter__()
    with pytest.raises(ValueError, match=r"device_type='quantum' is not a device type"):
        fork_rng(device_type="quantum").__enter__()


def test_unknown_object_in_devices_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"object of type builtins.float"):
        fork_rng(devices=[1.5]).__enter__()


def test_an_empty_device_type_list_means_no_device_type(simulate_device: Any) -> None:
    """device_type=[] names no device type: only the CPU is covered, not the accelerator."""
    cuda = simulate_device("cuda", count=1, accelerator=True)
    assert devrng.get_rng_state(device_type=[]).devices == {}
    assert "cuda" in devrng.get_rng_state().devices  # the default covers the accelerator
    before = cuda.generators[0].get_state()
    with fork_rng(device_type=[]):
        cuda.draw(0)
    assert not torch.equal(cuda.generators[0].get_state(), before)  # not forked

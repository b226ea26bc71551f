"""Snapshots, restoring them all-or-nothing, and manual_seed (devices SIMULATED here)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from tests._helpers import run_python

import devrng
from devrng import DevRNGError, RNGState


def draws() -> tuple[Any, ...]:
    return torch.rand(3), random.random(), np.random.rand(2)


def same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return torch.equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2])


def test_snapshot_restores_cpu_python_numpy() -> None:
    snap = devrng.get_rng_state()
    first = draws()
    devrng.set_rng_state(snap)
    assert same(first, draws())


def test_snapshot_can_leave_python_and_numpy_out() -> None:
    snap = devrng.get_rng_state(python=False, numpy=False)
    assert snap.python is None and snap.numpy is None
    py = random.random()
    devrng.set_rng_state(snap)
    assert random.random() != py


def test_snapshot_is_frozen_and_independent_of_later_draws() -> None:
    snap = devrng.get_rng_state()
    with pytest.raises(AttributeError, match="has no setter"):
        snap.cpu = torch.zeros(1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        snap.devices["cuda"] = {}  # type: ignore[index]
    fp = snap.fingerprint()
    draws()
    assert snap.fingerprint() == fp != devrng.get_rng_state().fingerprint()


def test_simulated_device_states_are_captured(simulate_device: Any) -> None:
    xpu = simulate_device("xpu", count=2)
    snap = devrng.get_rng_state(devices=["xpu:0", "xpu:1"])
    assert set(snap.devices["xpu"]) == {0, 1}
    a = [xpu.draw(0), xpu.draw(1)]
    devrng.set_rng_state(snap)
    assert torch.equal(a[0], xpu.draw(0)) and torch.equal(a[1], xpu.draw(1))


def test_mismatched_device_count_changes_nothing(simulate_device: Any) -> None:
    xpu = simulate_device("xpu", count=2)
    snap = devrng.get_rng_state(devices=["xpu:0", "xpu:1"])
    draws(), xpu.draw(0), xpu.draw(1)
    before = devrng.get_rng_state(devices=["xpu:0", "xpu:1"])
    xpu.generators.pop()  # this process now has one XPU
    with pytest.raises(DevRNGError, match=r"state for xpu:1, but this process has 1 xpu"):
        devrng.set_rng_state(snap)
    assert devrng.get_rng_state(devices=["xpu:0"]).fingerprint() == RNGState(
        before.cpu, {"xpu": {0: before.devices["xpu"][0]}}, before.python, before.numpy).fingerprint()


def test_mismatched_state_shape_changes_nothing(simulate_device: Any) -> None:
    simulate_device("cuda", count=1)
    good = devrng.get_rng_state(devices=["cuda:0"])
    bad = RNGState(good.cpu, {"cuda": {0: torch.zeros(7, dtype=torch.uint8)}}, good.python, good.numpy)
    draws()
    before = devrng.get_rng_state(devices=["cuda:0"])
    with pytest.raises(DevRNGError, match=r"cuda:0 state is a torch.uint8 tensor of shape \(7,\)"):
        devrng.set_rng_state(bad)
    assert devrng.get_rng_state(devices=["cuda:0"]) == before


def test_unknown_device_type_in_snapshot_changes_nothing() -> None:
    good = devrng.get_rng_state()
    bad = RNGState(good.cpu, {"nosuchdev": {0: torch.zeros(1)}})
    before = devrng.get_rng_state()
    with pytest.raises(DevRNGError, match=r"holds nosuchdev states, but this process cannot reach"):
        devrng.set_rng_state(bad)
    assert devrng.get_rng_state() == before


@pytest.mark.parametrize(("field", "value", "message"), [
    ("cpu", torch.zeros(3, dtype=torch.uint8), r"CPU state is a torch.uint8 tensor of shape \(3,\)"),
    ("cpu", torch.zeros(5056, dtype=torch.float32), r"CPU state is a torch.float32 tensor"),
    ("python", (3, (1, 2), None), r"Python state is not one that random.setstate accepts"),
    ("numpy", {"bit_generator": "PCG64"}, r"NumPy state is not one that NumPy's global generator "
                                          r"can take: its bit generator is 'PCG64'"),
])
def test_bad_host_states_change_nothing(field: str, value: Any, message: str,
                                        simulate_device: Any) -> None:
    simulate_device("cuda", count=1)
    good = devrng.get_rng_state(devices=["cuda:0"])
    parts = {"cpu": good.cpu, "python": good.python, "numpy": good.numpy, field: value}
    bad = RNGState(parts["cpu"], good.devices, parts["python"], parts["numpy"])
    draws()
    before = devrng.get_rng_state(devices=["cuda:0"])
    with pytest.raises(DevRNGError, match=message):
        devrng.set_rng_state(bad)
    assert devrng.get_rng_state(devices=["cuda:0"]) == before


def test_failure_while_setting_rolls_back_devices_already_set(simulate_device: Any) -> None:
    xpu = simulate_device("xpu", count=1)
    cuda = simulate_device("cuda", count=1)
    snap = devrng.get_rng_state(devices=["xpu:0", "cuda:0"])
    xpu.draw(0)
    cuda.draw(0)
    before = devrng.get_rng_state(devices=["xpu:0", "cuda:0"])
    cuda.fail_set = True
    with pytest.raises(DevRNGError, match=r"Restoring the snapshot failed \(RuntimeError: simulated"):
        devrng.set_rng_state(snap)
    cuda.fail_set = False
    assert devrng.get_rng_state(devices=["xpu:0", "cuda:0"]) == before


def test_set_rng_state_rejects_other_types() -> None:
    with pytest.raises(TypeError, match=r"takes a devrng.RNGState, not a Tensor"):
        devrng.set_rng_state(torch.get_rng_state())  # type: ignore[arg-type]


def test_saved_file_loads_weights_only_and_round_trips(tmp_path: Any) -> None:
    snap = devrng.get_rng_state()
    snap.save(tmp_path / "s.rng")
    data = torch.load(tmp_path / "s.rng", weights_only=True)
    assert data["version"] == 2 and isinstance(data["cpu"], torch.Tensor)
    assert data["devrng_version"] == devrng.__version__ and len(data["digest"]) == 64
    first = draws()
    devrng.set_rng_state(RNGState.load(tmp_path / "s.rng"))
    assert same(first, draws())


def test_corrupt_file_is_a_clear_error(tmp_path: Any) -> None:
    path = tmp_path / "broken.rng"
    devrng.get_rng_state().save(path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(DevRNGError, match=r"could not be read as a devrng RNG snapshot .* corrupt"):
        RNGState.load(path)


def test_a_directory_or_a_missing_path_is_a_sentence(tmp_path: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DevRNGError, match=r"is not a devrng RNG snapshot: it is a directory"):
        RNGState.load(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"There is no file 'step_9.rng' to load an RNG "
                                                rf"snapshot from; .* current directory, '{tmp_path}'"):
        RNGState.load("step_9.rng")
    (tmp_path / "dangling.rng").symlink_to(tmp_path / "gone.rng")
    with pytest.raises(FileNotFoundError, match=r"'dangling.rng' \(a symlink to a file that is "
                                                r"gone\) to load"):
        RNGState.load("dangling.rng")


def test_other_file_is_a_clear_error(tmp_path: Any) -> None:
    torch.save({"weights": torch.zeros(2)}, tmp_path / "model.pt")
    with pytest.raises(DevRNGError, match=r"model.pt' is not a valid devrng state for RNGState: "
                                          r"it is a dict with the keys 'weights', none of which "
                                          r"holds a devrng state\. Write "
                                          r"it with RNGState.save or RNGState.to_dict\(\)\."):
        RNGState.load(tmp_path / "model.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(DevRNGError, match=r"list.pt' is not a valid devrng state for RNGState: "
                                          r"it is \[1, 2\] \(of type list\)"):
        RNGState.load(tmp_path / "list.pt")
    # A dict handed over by other code is named as its caller names it, not as a file.
    with pytest.raises(DevRNGError, match=r"^the state from rank 1 is not a valid devrng state "
                                          r"for RNGState: its format tag is 'x'"):
        RNGState.from_dict({"format": "x"}, source="the state from rank 1")
    with pytest.raises(DevRNGError, match=r"^RNGState: the data is version 9; this devrng reads "
                                          r"versions 1, 2\.$"):
        RNGState.from_dict({"format": "devrng.RNGState", "version": 9})


def test_fingerprint_is_stable_across_processes(tmp_path: Any) -> None:
    # devices=[]: the CPU, Python and NumPy, which both processes have (the xla env's test
    # process also has XLA and torchax state, which a fresh interpreter does not).
    devrng.manual_seed(99)
    here = devrng.get_rng_state(devices=[]).fingerprint()
    code = ("import devrng; devrng.manual_seed(99); "
            "print(devrng.get_rng_state(devices=[]).fingerprint())")
    there = run_python(code)
    assert there.returncode == 0, there.stderr
    assert there.stdout.strip() == here
    assert len(here) == 16
    devrng.manual_seed(100)
    assert devrng.get_rng_state(devices=[]).fingerprint() != here


# -- manual_seed --------------------------------------------------------------------------

def test_manual_seed_makes_every_host_stream_reproducible() -> None:
    assert devrng.manual_seed(7) == 7
    a = draws()
    devrng.manual_seed(7)
    assert same(a, draws())
    devrng.manual_seed(8)
    assert not same(a, draws())


@pytest.mark.parametrize("seed", [0, 5, 2**31 + 7, 2**32 - 1])
def test_manual_seed_matches_torch_and_numpy_for_small_seeds(seed: int) -> None:
    devrng.manual_seed(seed)
    a = (torch.rand(2), np.random.rand(2), random.random())
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    assert torch.equal(a[0], torch.rand(2)) and np.array_equal(a[1], np.random.rand(2))
    assert a[2] == random.random()


@pytest.mark.parametrize("low", [0, 1, 2**31 + 7, 2**32 - 1])
@pytest.mark.parametrize("high", [1, 3 << 20, 2**31, 2**32 - 1])
def test_manual_seed_uses_all_64_bits_in_every_generator(low: int, high: int) -> None:
    """torch.manual_seed keeps the low 32 bits of a seed for the CPU generator; devrng's
    seeds that differ only above bit 32 give every generator, that one too, its own stream."""
    seed = (high << 32) | low
    torch.manual_seed(low)
    torch_low = torch.rand(3)
    torch.manual_seed(seed)
    assert torch.equal(torch_low, torch.rand(3))  # why devrng folds the high bits in
    devrng.manual_seed(low)
    a = draws()
    devrng.manual_seed(seed)
    b = draws()
    assert torch.equal(a[0], torch_low) and not torch.equal(a[0], b[0])
    # Python's random.seed itself gives high == low - 1 (mod 2**32) the stream of low alone.
    assert (a[1] == b[1]) == (high == (low - 1) % 2**32) and not np.array_equal(a[2], b[2])
    assert torch.initial_seed() == seed
    devrng.manual_seed(seed)
    assert same(b, draws())


def test_a_large_seed_starts_torch_cpu_generator_where_numpy_starts_its_own() -> None:
    """Above 2**32 the CPU generator's 624 MT19937 words are init_by_array([low, high]),
    which NumPy's legacy seeding computes independently."""
    for seed in (2**32, 2**40 + 12345, 2**64 - 1):
        devrng.manual_seed(seed)
        key = np.random.RandomState([seed & 0xFFFFFFFF, seed >> 32]).get_state()[1]
        words = torch.get_rng_state()[24:24 + 8 * 624].view(torch.int64).numpy()
        assert np.array_equal(words, key.astype(np.int64))
        assert np.array_equal(np.random.get_state()[1], key)  # NumPy seeded the same way


def test_a_large_seed_is_refused_where_the_cpu_state_layout_is_unknown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated: a torch whose CPU state devrng cannot fill; small seeds still work."""
    from tests._internals import host

    monkeypatch.setattr(host, "_layout", [False])
    before = devrng.get_rng_state()
    with pytest.raises(DevRNGError, match=r"lays out its CPU generator's state in a way devrng "
                                          r"does not know.*seed with a value below 2\*\*32"):
        devrng.manual_seed(2**40)
    assert devrng.get_rng_state() == before
    assert devrng.manual_seed(2**32 - 1) == 2**32 - 1


def test_manual_seed_seeds_simulated_devices(simulate_device: Any) -> None:
    xpu = simulate_device("xpu", count=2)
    devrng.manual_seed(11)
    a = (xpu.draw(0), xpu.draw(1))
    devrng.manual_seed(11)
    assert torch.equal(a[0], xpu.draw(0)) and torch.equal(a[1], xpu.draw(1))


def test_manual_seed_restricted_to_named_types(simulate_device: Any) -> None:
    xpu = simulate_device("xpu", count=1)
    cuda = simulate_device("cuda", count=1)
    before = cuda.generators[0].get_state()
    devrng.manual_seed(3, device_type="xpu")
    assert torch.equal(cuda.generators[0].get_state(), before)
    assert torch.equal(xpu.generators[0].get_state(), torch.Generator().manual_seed(3).get_state())


@pytest.mark.parametrize(("seed", "error", "message"), [
    (True, TypeError, r"seed must be an int in \[0, 2\*\*64\), not True \(a bool\)"),
    (1.0, TypeError, r"not 1.0 \(a float\)"),
    ("1", TypeError, r"not '1' \(a str\)"),
    (None, TypeError, r"not None \(a NoneType\)"),
    (-1, ValueError, r"seed=-1 is out of range"),
    (2**64, ValueError, r"seed=18446744073709551616 is out of range"),
])
def test_manual_seed_rejects_bad_seeds(seed: Any, error: type, message: str) -> None:
    before = devrng.get_rng_state()
    with pytest.raises(error, match=message):
        devrng.manual_seed(seed)
    assert devrng.get_rng_state() == before


def test_manual_seed_accepts_numpy_integers() -> None:
    assert devrng.manual_seed(np.uint64(2**63)) == 2**63

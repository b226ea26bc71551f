"""patch_torch's device modules, on SIMULATED third-party device types torch has no module for.

``ve`` and ``ipu`` are device types torch's ``torch.device`` accepts but for
which it has no ``torch.<type>`` module, like XLA. Fake devrng backends back
them with plain integers (like XLA's 64-bit seeds) or real torch.Generator
states; torch's own RNG sites (``torch.random.fork_rng``, the helpers of
``torch.utils.checkpoint``) then run against them for real.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.utils.checkpoint as tcp
from tests._fakes import HAS_XLA
from tests._internals import DeviceRNGModule, registered_device_types, unregister_backend

import devrng

TORCH_FORK_RNG = torch.random.fork_rng  # torch's own, captured before any patching


class IntSeedBackend:
    """SIMULATED device type whose state is one unsigned 64-bit seed per device (like XLA)."""

    def __init__(self, name: str, count: int = 2) -> None:
        self.name = name
        self.seeds = [101 + i for i in range(count)]
        self.initialized = True
        self.current = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return len(self.seeds)

    def current_device(self) -> int:
        return self.current

    def get_rng_state(self, index: int) -> int:
        return self.seeds[index]

    def set_rng_state(self, state: int, index: int) -> None:
        if not isinstance(state, int):
            raise TypeError(f"simulated backend wants an int seed, got {type(state).__name__}")
        self.seeds[index] = state

    def manual_seed(self, seed: int) -> None:
        self.seeds = [seed] * len(self.seeds)

    def draw(self, index: int) -> int:
        """A "random op" on device ``index``: advances its seed the way XLA's running seed does."""
        self.seeds[index] = (self.seeds[index] * 6364136223846793005 + 1442695040888963407) % 2**64
        return self.seeds[index]


class GeneratorBackend:
    """SIMULATED device type whose states are real torch.Generator state tensors."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gen = torch.Generator().manual_seed(7)

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def get_rng_state(self, index: int) -> torch.Tensor:
        return self.gen.get_state()

    def set_rng_state(self, state: torch.Tensor, index: int) -> None:
        self.gen.set_state(state)

    def manual_seed(self, seed: int) -> None:
        self.gen.manual_seed(seed)


class DictStateBackend(GeneratorBackend):
    """SIMULATED device type whose state is a dict: torch's sites cannot carry it."""

    def get_rng_state(self, index: int) -> Any:  # type: ignore[override]
        return {"state": self.gen.get_state()}


def _add_backend(name: str, backend: Any) -> None:
    devrng.register_backend(name, backend)


def _drop_backend(name: str) -> None:
    unregister_backend(name)


@pytest.fixture
def ve() -> Iterator[IntSeedBackend]:
    backend = IntSeedBackend("ve")
    _add_backend("ve", backend)
    yield backend
    devrng.unpatch_torch()
    _drop_backend("ve")


@pytest.fixture(autouse=True)
def _always_unpatch() -> Iterator[None]:
    yield
    devrng.unpatch_torch()


def test_torch_sites_fail_without_patch_simulated(ve: IntSeedBackend) -> None:
    assert getattr(torch, "ve", None) is None
    with pytest.raises(RuntimeError, match=r"torch has no module of `ve`|module registered as .torch\.ve."), TORCH_FORK_RNG(devices=[0], device_type="ve"):
        pass
    with pytest.raises(AttributeError, match="has no attribute 've'"):
        tcp.set_device_states([0], [torch.zeros(8, dtype=torch.uint8)], device_type="ve")


def test_patch_registers_module_and_unpatch_removes_it_simulated(ve: IntSeedBackend) -> None:
    devrng.patch_torch()
    devrng.patch_torch()  # idempotent
    module = torch.ve  # type: ignore[attr-defined]
    assert isinstance(module, DeviceRNGModule)
    assert sys.modules["torch.ve"] is module
    assert torch.get_device_module("ve") is module
    assert module._initialized is True
    assert "ve" in registered_device_types()

    devrng.unpatch_torch()
    devrng.unpatch_torch()  # idempotent
    assert not hasattr(torch, "ve")
    assert "torch.ve" not in sys.modules
    with pytest.raises(RuntimeError, match="does not have a corresponding module"):
        torch.get_device_module("ve")  # its cache must not keep our module alive

    devrng.patch_torch()  # torch refuses re-registration unless the old one is fully gone
    assert isinstance(torch.ve, DeviceRNGModule)  # type: ignore[attr-defined]


def test_existing_modules_are_never_touched_simulated() -> None:
    builtin = {name: getattr(torch, name) for name in ("cpu", "cuda", "xpu", "mps")}
    foreign = types.ModuleType("a_plugins_fpga_module")
    torch._register_device_module("fpga", foreign)
    _add_backend("fpga", IntSeedBackend("fpga"))
    try:
        devrng.patch_torch()
        assert torch.fpga is foreign  # type: ignore[attr-defined]
        for name, module in builtin.items():
            assert getattr(torch, name) is module
        devrng.unpatch_torch()
        assert torch.fpga is foreign  # type: ignore[attr-defined]
    finally:
        devrng.unpatch_torch()
        _drop_backend("fpga")
        delattr(torch, "fpga")
        sys.modules.pop("torch.fpga", None)
        torch.get_device_module.cache_clear()


def test_backend_for_a_name_torch_does_not_know_gets_no_module_simulated() -> None:
    _add_backend("mydev", IntSeedBackend("mydev"))
    try:
        devrng.patch_torch()
        assert not hasattr(torch, "mydev")
    finally:
        _drop_backend("mydev")


@pytest.mark.skipif(HAS_XLA,
                    reason="torch_xla is installed here: test_checkpoint_xla.py covers it")
def test_no_xla_module_without_torch_xla() -> None:
    devrng.patch_torch()
    assert not hasattr(torch, "xla")


@pytest.mark.parametrize("seed", [0, 2**63 - 1, 2**63 + 5, 2**64 - 1])
def test_uint64_state_round_trips_losslessly_simulated(ve: IntSeedBackend, seed: int) -> None:
    devrng.patch_torch()
    ve.seeds[1] = seed
    state = torch.ve.get_rng_state(1)  # type: ignore[attr-defined]
    assert state.dtype == torch.uint8
    assert state.shape == (8,)
    ve.seeds[1] = 3
    torch.ve.set_rng_state(state, 1)  # type: ignore[attr-defined]
    assert ve.seeds[1] == seed


def test_naive_int64_encoding_overflows() -> None:
    # Why states travel as bytes: XLA seeds >= 2**63 do not fit an int64 tensor.
    with pytest.raises((RuntimeError, ValueError), match=r"[Oo]verflow"):
        torch.tensor(2**64 - 1, dtype=torch.int64)


@pytest.mark.filterwarnings("ignore:VE reports that you have 2 available devices")
@pytest.mark.parametrize("fork_name", ["torch", "devrng"])
@pytest.mark.parametrize("devices", [None, [1], [torch.device("ve:1")], ["ve:1"]])
def test_fork_rng_restores_simulated_device(ve: IntSeedBackend, fork_name: str,
                                            devices: Any) -> None:
    devrng.patch_torch()
    fork = TORCH_FORK_RNG if fork_name == "torch" else torch.random.fork_rng
    ve.seeds[1] = 2**64 - 3
    before = list(ve.seeds)
    with fork(devices=devices, device_type="ve"):
        ve.draw(1)
        assert ve.seeds != before
    assert ve.seeds == before


def test_checkpoint_state_helpers_per_device_simulated(ve: IntSeedBackend) -> None:
    devrng.patch_torch()
    module = torch.ve  # type: ignore[attr-defined]
    ve.seeds = [2**63 + 1, 2**64 - 1]
    # What get_device_states does for each device id:
    states = []
    for index in (0, 1):
        with module.device(index):
            states.append(module.get_rng_state())
    ve.draw(0)
    ve.draw(1)
    tcp.set_device_states([0, 1], states, device_type="ve")
    assert ve.seeds == [2**63 + 1, 2**64 - 1]


def test_device_context_nests_and_minus_one_means_current_simulated(ve: IntSeedBackend) -> None:
    devrng.patch_torch()
    module = torch.ve  # type: ignore[attr-defined]
    ve.current = 1
    assert module.current_device() == 1
    with module.device(0):
        assert module.current_device() == 0
        with module.device("ve:1"):
            assert module.current_device() == 1
        with module.device(-1):
            assert module.current_device() == 0
        assert module.current_device() == 0
    assert module.current_device() == 1
    ve.seeds = [5, 6]
    assert module.get_rng_state().tolist() == [6, 0, 0, 0, 0, 0, 0, 0]


def test_state_all_and_seeding_simulated(ve: IntSeedBackend) -> None:
    devrng.patch_torch()
    module = torch.ve  # type: ignore[attr-defined]
    ve.seeds = [2**64 - 1, 9]
    states = module.get_rng_state_all()
    module.manual_seed_all(-1)  # wraps like torch.manual_seed
    assert ve.seeds == [2**64 - 1, 2**64 - 1]
    module.set_rng_state_all(states)
    assert ve.seeds == [2**64 - 1, 9]
    assert module.device_count() == 2
    assert module.is_available()
    with pytest.raises(NotImplementedError, match=r"can only seed all its devices.*manual_seed_all"):
        module.manual_seed(3)
    with pytest.raises(ValueError, match="got 1 state\\(s\\) for 2 ve device"):
        module.set_rng_state_all(states[:1])


def test_initialized_flag_follows_backend_simulated(ve: IntSeedBackend) -> None:
    devrng.patch_torch()
    ve.initialized = False
    assert getattr(torch.ve, "_initialized", None) is False  # type: ignore[attr-defined]
    ve.initialized = True
    assert getattr(torch.ve, "_initialized", None) is True  # type: ignore[attr-defined]


def test_bad_states_and_devices_are_refused_simulated(ve: IntSeedBackend) -> None:
    devrng.patch_torch()
    module = torch.ve  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="torch.ve.set_rng_state got a torch.int64 tensor of shape "
                                        r"\(1,\); it accepts the 8-element uint8 tensor"):
        module.set_rng_state(torch.tensor([5]), 0)
    with pytest.raises(ValueError, match="got the seed -1, which is out of range"):
        module.set_rng_state(-1, 0)
    with pytest.raises(ValueError, match="device index 2, but this process has 2 ve device"):
        module.get_rng_state(2)
    with pytest.raises(ValueError, match=r"of type 'cpu'; torch\.ve only handles devices of type 've'"):
        module.get_rng_state("cpu")
    with pytest.raises(TypeError, match=r"got 1\.5 \(a float\) as device"):
        module.get_rng_state(1.5)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        module.no_such_thing  # noqa: B018


def test_tensor_states_pass_through_simulated() -> None:
    backend = GeneratorBackend("ipu")
    _add_backend("ipu", backend)
    try:
        devrng.patch_torch()
        state = torch.ipu.get_rng_state()  # type: ignore[attr-defined]
        expected = torch.rand(4, generator=backend.gen)
        torch.ipu.set_rng_state(state)  # type: ignore[attr-defined]
        assert torch.equal(torch.rand(4, generator=backend.gen), expected)
        torch.ipu.manual_seed(11)  # type: ignore[attr-defined]  (one device: seeds it)
        assert torch.equal(torch.rand(4, generator=backend.gen),
                           torch.rand(4, generator=torch.Generator().manual_seed(11)))
    finally:
        devrng.unpatch_torch()
        _drop_backend("ipu")


def test_state_torch_cannot_carry_is_refused_simulated() -> None:
    _add_backend("ipu", DictStateBackend("ipu"))
    try:
        devrng.patch_torch()
        with pytest.raises(TypeError, match="returned a dict state, which torch's RNG sites "
                                            "cannot carry"):
            torch.ipu.get_rng_state()  # type: ignore[attr-defined]
    finally:
        devrng.unpatch_torch()
        _drop_backend("ipu")

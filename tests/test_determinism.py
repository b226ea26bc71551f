"""``devrng.deterministic()``: what it switches, what it restores, and the CUBLAS_WORKSPACE_CONFIG rule."""

from __future__ import annotations

import os
import random
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from tests._fakes import registered
from tests._helpers import generator_states, set_environ
from tests._internals import bytecode, current_settings

import devrng

CUBLAS = "CUBLAS_WORKSPACE_CONFIG"
INDUCTOR_ENV = "TORCHINDUCTOR_DETERMINISTIC"
INDUCTOR_MODULE = "torch._inductor.config"  # torch's module that holds the switch


def _inductor_switch_exists() -> bool:
    """Whether this torch has inductor's deterministic switch, as devrng's report says."""
    return bool(current_settings()["torch._inductor.config.deterministic"]
                ["available"])


def flags() -> dict[str, Any]:
    """Every global switch deterministic() may touch, read straight from torch and os.environ."""
    return {
        "benchmark": torch.backends.cudnn.benchmark,
        "cudnn_det": torch.backends.cudnn.deterministic,
        "algorithms": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "fill": torch.utils.deterministic.fill_uninitialized_memory,
        "mkldnn": torch.backends.mkldnn.deterministic,
        "inductor": getattr(sys.modules.get(INDUCTOR_MODULE), "deterministic", None),
        **{k: os.environ.get(k) for k in (CUBLAS, INDUCTOR_ENV, "XLA_FLAGS")},
    }


rng = generator_states


@pytest.fixture(autouse=True)
def _clean_switches() -> Iterator[None]:
    """Start each test from torch's defaults with no determinism variables; put all back after."""
    # Put the variables back by hand: monkeypatch.delenv records nothing for an absent
    # variable, so one a test sets directly would outlive it.
    env = {var: os.environ.pop(var, None) for var in (CUBLAS, INDUCTOR_ENV)}
    before = flags()
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
             torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.utils.deterministic.fill_uninitialized_memory,
             torch.backends.mkldnn.deterministic)
    yield
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[0], saved[1]
    torch._C._set_deterministic_algorithms(saved[2], warn_only=saved[3])
    torch.utils.deterministic.fill_uninitialized_memory = saved[4]
    torch.backends.mkldnn.deterministic = saved[5]
    set_environ(env)
    assert flags()["algorithms"] == before["algorithms"]


def non_default_start() -> None:
    """Values a user might already have, so that "restored" cannot mean "reset to defaults"."""
    torch.backends.cudnn.benchmark = True
    # torch._C's setter: torch 2.13's public one would import inductor (seconds)
    torch._C._set_deterministic_algorithms(False, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    os.environ[CUBLAS] = ":0:0"


# ------------------------------------------------------------------ applying
def test_bare_call_applies_every_switch() -> None:
    handle = devrng.deterministic()
    try:
        now = flags()
        assert now["benchmark"] is False
        assert now["cudnn_det"] is True
        assert now["algorithms"] is True
        assert now["warn_only"] is False
        assert now["fill"] is True
        assert now["mkldnn"] is True
        assert now[CUBLAS] == ":4096:8"
        if _inductor_switch_exists():  # torch 2.13, not 2.9
            assert now[INDUCTOR_ENV] == "1" or now["inductor"] is True
        else:
            assert now[INDUCTOR_ENV] is None
    finally:
        handle.restore()


def test_deterministic_algorithms_take_effect() -> None:
    # fill_uninitialized_memory: torch.empty is filled with NaN, but only in deterministic mode
    with devrng.deterministic():
        assert torch.empty(64).isnan().all()
        assert (torch.empty(8, dtype=torch.int32) == torch.iinfo(torch.int32).max).all()
    with devrng.deterministic(fill_uninitialized_memory=False):
        assert torch.utils.deterministic.fill_uninitialized_memory is False


def test_warn_only_and_arguments_are_passed() -> None:
    with devrng.deterministic(warn_only=True, cublas_workspace_config=":16:8"):
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ[CUBLAS] == ":16:8"
    with devrng.deterministic(cublas_workspace_config=None):
        assert CUBLAS not in os.environ


def test_seed_seeds_torch_python_and_numpy() -> None:
    with devrng.deterministic(seed=1234):
        got = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    assert torch.equal(got[0], torch.rand(3))
    assert got[1] == random.random()
    assert got[2] == np.random.rand()


def test_without_seed_rng_is_untouched() -> None:
    before = rng()
    with devrng.deterministic():
        assert before == rng()


# ------------------------------------------------------------------ restoring
def test_with_block_restores_flags_env_and_rng() -> None:
    non_default_start()
    before_flags, before_rng = flags(), rng()
    with devrng.deterministic(seed=3) as handle:
        assert flags() != before_flags
        torch.rand(5), random.random(), np.random.rand()
        assert isinstance(handle, devrng.DeterministicHandle)
    assert flags() == before_flags
    assert before_rng == rng()


def test_restores_after_exception_inside() -> None:
    non_default_start()
    before_flags, before_rng = flags(), rng()
    def body() -> None:
        with devrng.deterministic(seed=3):
            torch.rand(5)
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        body()
    assert flags() == before_flags
    assert before_rng == rng()


def test_restores_unset_variables_to_unset() -> None:
    assert CUBLAS not in os.environ
    with devrng.deterministic():
        assert CUBLAS in os.environ
    assert CUBLAS not in os.environ
    assert INDUCTOR_ENV not in os.environ


def test_nested_blocks_restore_the_outer_settings() -> None:
    with devrng.deterministic(seed=1, warn_only=True, cublas_workspace_config=":16:8"):
        outer = flags(), rng()
        with devrng.deterministic(seed=2, cublas_workspace_config=":4096:8"):
            assert os.environ[CUBLAS] == ":4096:8"
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert flags() == outer[0]
        assert outer[1] == rng()


def test_handle_can_be_restored_and_entered_again() -> None:
    handle = devrng.deterministic(seed=5)
    handle.restore()
    assert not torch.are_deterministic_algorithms_enabled()
    with handle:
        assert torch.are_deterministic_algorithms_enabled()
        first = torch.rand(2)
    assert not torch.are_deterministic_algorithms_enabled()
    with handle:
        assert torch.equal(torch.rand(2), first)


class _Holder:
    handle: devrng.DeterministicHandle


def test_a_handle_kept_from_a_bare_call_stays_on_after_its_with_block() -> None:
    """`handle = deterministic()` applies until `handle.restore()`: a later `with handle:`
    (a name or an attribute) ends with the settings as they were when it started, on. They
    went off at the block's end before (the bare call's entry did not count)."""
    handle = devrng.deterministic(seed=5)
    with handle:
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.are_deterministic_algorithms_enabled() and handle.active
    holder = _Holder()
    holder.handle = handle
    with holder.handle, handle:
        pass
    assert torch.are_deterministic_algorithms_enabled() and handle.active
    handle.restore()  # the bare call's own end
    assert not torch.are_deterministic_algorithms_enabled() and not handle.active
    with handle:  # restored, then entered: this block applies it and owns it
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()


def test_a_handle_made_by_its_with_statement_or_entered_by_exit_stack_is_owned_by_it() -> None:
    import contextlib

    def made() -> devrng.DeterministicHandle:
        return devrng.deterministic()

    for enter in (lambda: made(), lambda: devrng.deterministic(seed=1)):
        with enter():
            assert torch.are_deterministic_algorithms_enabled()
        assert not torch.are_deterministic_algorithms_enabled()
    handle = devrng.deterministic()
    with contextlib.ExitStack() as stack:  # not a with statement: the stack owns what it enters
        stack.enter_context(handle)
    assert not torch.are_deterministic_algorithms_enabled() and not handle.active


def test_on_an_untested_python_every_with_owns_its_handle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where devrng's bytecode reading is not tested (devrng._base.bytecode), `with handle:`
    cannot be told from `with deterministic():`: it restores at its exit, the old rule."""
    monkeypatch.setattr(bytecode, "TESTED", ())
    handle = devrng.deterministic()
    with handle:
        pass
    assert not torch.are_deterministic_algorithms_enabled() and not handle.active


def test_simulated_cuda_rng_state_is_restored(simulate_device: Callable[..., Any],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CUBLAS, ":4096:8")  # CUDA already runs: the variable must be right
    cuda = simulate_device("cuda", count=2, initialized=True)
    before = [g.get_state() for g in cuda.generators]
    with devrng.deterministic(seed=77):
        # both SIMULATED devices were seeded, like torch.cuda.manual_seed_all
        assert torch.equal(cuda.draw(0), cuda.draw(1))
    assert all(torch.equal(g.get_state(), s) for g, s in zip(cuda.generators, before, strict=True))


def test_simulated_uninitialised_cuda_is_not_started(simulate_device: Callable[..., Any]) -> None:
    cuda = simulate_device("cuda", count=1, initialized=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # CUDA not running yet: no CUBLAS warning either
        with devrng.deterministic(seed=1):
            assert os.environ[CUBLAS] == ":4096:8"
    assert cuda.init_calls == 0


# ------------------------------------------------------------------ CUBLAS_WORKSPACE_CONFIG
def test_simulated_initialised_cuda_without_variable_raises(
        simulate_device: Callable[..., Any]) -> None:
    simulate_device("cuda", initialized=True)
    torch.backends.cudnn.benchmark = True
    before = flags(), rng()
    with pytest.raises(devrng.DevRNGError, match=(
            r"CUBLAS_WORKSPACE_CONFIG is not set and CUDA is already initialised.*"
            r"Set it before the first CUDA call.*`CUBLAS_WORKSPACE_CONFIG=:4096:8 python "
            r"train.py`.*warn_only=True")):
        devrng.deterministic(seed=1)
    assert flags() == before[0]  # nothing was changed
    assert before[1] == rng()


def test_simulated_initialised_cuda_with_wrong_value_warns_with_warn_only(
        simulate_device: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    simulate_device("cuda", initialized=True)
    monkeypatch.setenv(CUBLAS, ":0:0")
    with pytest.warns(UserWarning, match=(
            r"CUBLAS_WORKSPACE_CONFIG is ':0:0' and CUDA is already initialised.*cannot pick up "
            r"':4096:8'.*Set it before the first CUDA call")):
        handle = devrng.deterministic(warn_only=True)
    # Setting it now would only silence torch's own cuBLAS check: it is left alone.
    assert os.environ[CUBLAS] == ":0:0"
    assert torch.are_deterministic_algorithms_enabled()
    handle.restore()
    with pytest.raises(devrng.DevRNGError, match="':0:0'"):
        devrng.deterministic(warn_only=False)


def test_simulated_initialised_cuda_with_the_other_deterministic_value_only_warns(
        simulate_device: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    simulate_device("cuda", initialized=True)
    monkeypatch.setenv(CUBLAS, ":16:8")
    with pytest.warns(UserWarning, match="':16:8'.*deterministic too"), \
            devrng.deterministic():
        assert torch.are_deterministic_algorithms_enabled()


def test_simulated_initialised_cuda_with_right_value_is_silent(
        simulate_device: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    simulate_device("cuda", initialized=True)
    monkeypatch.setenv(CUBLAS, ":4096:8")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with devrng.deterministic():
            assert os.environ[CUBLAS] == ":4096:8"
            assert torch.are_deterministic_algorithms_enabled()
    assert [str(w.message) for w in seen] == []


# ------------------------------------------------------------------ bad arguments
@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"seed": -1}, ValueError, r"seed=-1 is out of range"),
    ({"seed": "0"}, TypeError, r"seed must be an int"),
    ({"warn_only": 1}, TypeError, r"warn_only must be True or False, not 1"),
    ({"fill_uninitialized_memory": None}, TypeError, r"fill_uninitialized_memory must be"),
    ({"cublas_workspace_config": "4096:8"}, ValueError,
     r"cublas_workspace_config='4096:8' is not a cuBLAS workspace setting; pass ':4096:8'"),
])
def test_bad_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    before = flags()
    with pytest.raises(error, match=match):
        devrng.deterministic(**kwargs)
    assert flags() == before


# ------------------------------------------------------------------ report
def test_report_lists_every_setting_with_previous_values() -> None:
    torch.backends.cudnn.benchmark = True
    with devrng.deterministic(seed=9) as handle:
        report = handle.report()
    assert set(report) >= {
        "torch.backends.cudnn.benchmark", "torch.backends.cudnn.deterministic",
        "torch.use_deterministic_algorithms", "torch.utils.deterministic.fill_uninitialized_memory",
        "torch.backends.mkldnn.deterministic", "torch._inductor.config.deterministic", CUBLAS,
        "seed"}
    for entry in report.values():
        assert set(entry) == {"value", "available", "target", "previous", "note"}
    bench = report["torch.backends.cudnn.benchmark"]
    assert (bench["value"], bench["previous"], bench["target"], bench["available"]) == (
        False, True, False, True)
    assert report["torch.use_deterministic_algorithms"]["value"] == (True, False)
    assert report[CUBLAS]["previous"] is None
    assert report["seed"]["value"] == 9


def test_current_settings_reads_without_changing() -> None:
    before = flags(), rng()
    settings = current_settings()
    assert flags() == before[0]
    assert before[1] == rng()
    assert settings["torch.backends.cudnn.deterministic"]["value"] is False
    assert settings["torch.backends.cudnn.deterministic"]["target"] is True
    with devrng.deterministic() as handle:
        assert set(handle.report()) - set(current_settings()) == {"seed"}


def test_missing_switch_is_reported_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    # SIMULATED older torch without a oneDNN switch.
    real = torch.backends.mkldnn
    monkeypatch.setattr(torch.backends, "mkldnn", types.SimpleNamespace())
    with devrng.deterministic() as handle:
        entry = handle.report()["torch.backends.mkldnn.deterministic"]
        assert entry["available"] is False
        assert entry["value"] is None
        assert real.deterministic is False  # not touched
    assert torch.are_deterministic_algorithms_enabled() is False


# ------------------------------------------------------------------ backend hooks
class _HookBackend:
    """A third-party backend with the optional determinism members."""

    name = "hookdev"
    deterministic_note = "hookdev's own switch"

    def __init__(self) -> None:
        self.flag = False
        self.calls: list[bool] = []

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def get_rng_state(self, index: int) -> torch.Tensor:
        return torch.zeros(1)

    def set_rng_state(self, state: Any, index: int) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        pass

    def get_deterministic(self) -> bool:
        return self.flag

    def set_deterministic(self, flag: bool) -> bool:
        previous, self.flag = self.flag, flag
        self.calls.append(flag)
        os.environ["HOOKDEV_DETERMINISTIC"] = "1" if flag else "0"
        return previous


@pytest.fixture
def hook_backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[_HookBackend]:
    backend = _HookBackend()
    monkeypatch.delenv("HOOKDEV_DETERMINISTIC", raising=False)
    with registered(backend.name, backend):
        yield backend


def test_backend_hook_is_applied_reported_and_restored(hook_backend: _HookBackend) -> None:
    with devrng.deterministic() as handle:
        assert hook_backend.flag is True
        entry = handle.report()["backend.hookdev.deterministic"]
        assert entry == {"value": True, "available": True, "target": True, "previous": False,
                         "note": "hookdev's own switch"}
    assert hook_backend.calls == [True, False]
    assert "HOOKDEV_DETERMINISTIC" not in os.environ  # variables the hook set are put back


def test_backend_hook_failure_rolls_back(hook_backend: _HookBackend,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(flag: bool) -> bool:
        raise RuntimeError("hookdev refuses")

    monkeypatch.setattr(hook_backend, "set_deterministic", broken)
    before = flags()
    with pytest.raises(RuntimeError, match="hookdev refuses"):
        devrng.deterministic(seed=1)
    assert flags() == before


def test_simulated_ipex_onednn_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    # SIMULATED IPEX: intel_extension_for_pytorch.xpu.deterministics with its two switches.
    state = {"on": False}
    det = types.ModuleType("intel_extension_for_pytorch.xpu.deterministics")
    det.enable_onednn_deterministic = lambda: state.update(on=True)  # type: ignore[attr-defined]
    det.disable_onednn_deterministic = lambda: state.update(on=False)  # type: ignore[attr-defined]
    xpu = types.ModuleType("intel_extension_for_pytorch.xpu")
    xpu.deterministics = det  # type: ignore[attr-defined]
    ipex = types.ModuleType("intel_extension_for_pytorch")
    ipex.xpu = xpu  # type: ignore[attr-defined]
    for name, mod in ((ipex.__name__, ipex), (xpu.__name__, xpu), (det.__name__, det)):
        monkeypatch.setitem(sys.modules, name, mod)
    before = current_settings()["backend.xpu.deterministic"]
    assert before["available"] is True
    assert before["value"] is False
    with devrng.deterministic() as handle:
        assert state["on"] is True
        assert handle.report()["backend.xpu.deterministic"]["value"] is True
    assert state["on"] is False


def test_without_ipex_the_xpu_switch_is_unavailable() -> None:
    if "intel_extension_for_pytorch" in sys.modules:
        pytest.skip("IPEX is loaded in this process")
    entry = current_settings()["backend.xpu.deterministic"]
    assert entry["available"] is False


def test_xla_flag_is_set_and_restored_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch_xla")
    import torch_xla

    torch.ones(1, device=torch_xla.device()).cpu()  # runtime up: its RNG state is snapshotted
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    backend = devrng.get_backend("xla")
    xla_before = backend.get_rng_state(0)
    with devrng.deterministic(seed=5) as handle:
        assert os.environ["XLA_FLAGS"].split() == [
            "--xla_cpu_enable_fast_math=false", "--xla_gpu_deterministic_ops=true"]
        assert handle.report()["backend.xla.deterministic"]["value"] is True
        assert backend.get_rng_state(0) == 5  # seed reaches XLA, unlike torch.manual_seed
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
    assert backend.get_rng_state(0) == xla_before
    monkeypatch.delenv("XLA_FLAGS")
    with devrng.deterministic():
        assert os.environ["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=true"
    assert "XLA_FLAGS" not in os.environ


# ------------------------------------------------------------------ inductor
def test_inductor_switch_follows_its_import_state(monkeypatch: pytest.MonkeyPatch) -> None:
    if not _inductor_switch_exists():
        pytest.skip(f"torch {torch.__version__} has no torch._inductor.config.deterministic")
    if INDUCTOR_MODULE in sys.modules:
        pytest.skip("inductor is already imported in this process")
    # Not imported: the variable it reads at import is set, and put back.
    with devrng.deterministic():
        assert os.environ[INDUCTOR_ENV] == "1"
        # SIMULATED import of inductor inside the block (the real one takes seconds)
        fake = types.SimpleNamespace(deterministic=True)
        monkeypatch.setitem(sys.modules, INDUCTOR_MODULE, fake)
    assert INDUCTOR_ENV not in os.environ
    assert fake.deterministic is False
    # Imported: the attribute itself is switched and put back.
    with devrng.deterministic():
        assert fake.deterministic is True
        assert INDUCTOR_ENV not in os.environ
    assert fake.deterministic is False

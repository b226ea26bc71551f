"""devrng with the REAL Intel Extension for PyTorch imported (the ipex environment).

PyPI's intel-extension-for-pytorch 2.8.0 is a CPU-only build pinned to torch
2.8: it ships ``intel_extension_for_pytorch.xpu`` (random.py, generator.py,
lazy_init.py) but no XPU runtime and no ``xpu.deterministics``. These tests
import it for real and check what devrng's XPU paths meet: devrng uses native
``torch.xpu`` and never calls IPEX's own RNG functions, which on this build
raise on reads and silently queue seeds and writes.

IPEX is imported when this module is collected, so in the ipex environment
the whole suite runs with IPEX loaded, as a program that uses it would.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import pytest
import torch

ipex = pytest.importorskip("intel_extension_for_pytorch")

from tests._internals import current_settings  # noqa: E402

import devrng  # noqa: E402
from devrng.__main__ import main  # noqa: E402

lazy_init = importlib.import_module("intel_extension_for_pytorch.xpu.lazy_init")
xpu_backend = devrng.get_backend("xpu")

pytestmark = pytest.mark.skipif(
    ipex._C._has_xpu() or torch.xpu.is_available(),
    reason="these tests describe IPEX's CPU-only build on a machine without an XPU",
)


@pytest.fixture
def ipex_queues(monkeypatch: pytest.MonkeyPatch) -> Any:
    """IPEX's lazy-call queue and seed tracker, fresh for the test and put back after."""
    monkeypatch.setattr(lazy_init, "_queued_calls", [])
    monkeypatch.setattr(lazy_init, "_lazy_seed_tracker", lazy_init._LazySeedTracker())
    return lazy_init


# -- what was installed ---------------------------------------------------------------
def test_ipex_is_the_cpu_build_for_this_torch_minor() -> None:
    assert ipex.__version__.split(".")[:2] == torch.__version__.split(".")[:2]
    assert not ipex._C._has_xpu()
    assert torch.xpu is not ipex.xpu  # a CPU build does not register itself as torch.xpu
    assert not torch.xpu._is_compiled()


def test_ipex_xpu_modules_that_exist_and_the_one_that_does_not() -> None:
    for name in ("random", "generator", "lazy_init"):
        importlib.import_module(f"intel_extension_for_pytorch.xpu.{name}")
    with pytest.raises(ModuleNotFoundError, match="deterministics"):
        importlib.import_module("intel_extension_for_pytorch.xpu.deterministics")


# -- devrng's normal path: native torch.xpu ---------------------------------------------
def test_xpu_backend_uses_native_torch_xpu_with_ipex_imported() -> None:
    assert "intel_extension_for_pytorch" in sys.modules
    assert xpu_backend.module is torch.xpu
    assert devrng.get_backend("xpu").module is torch.xpu  # type: ignore[attr-defined]


def test_xpu_is_reported_unavailable_without_a_device() -> None:
    assert xpu_backend.is_available() is False
    assert xpu_backend.device_count() == 0
    assert xpu_backend.is_initialized() is False
    assert "xpu" not in devrng.available_backends()
    assert "cpu" in devrng.available_backends()


def test_naming_an_xpu_device_is_a_clear_error_not_an_ipex_assertion() -> None:
    with pytest.raises(ValueError, match="does not exist: this process has no xpu device"):
        devrng.get_rng_state(devices=["xpu:0"])
    with pytest.raises(ValueError, match="no xpu device"), devrng.fork_rng(devices=["xpu:0"]):
        pass


def test_seeding_and_forking_never_touch_ipex(ipex_queues: Any) -> None:
    devrng.manual_seed(123)
    a = torch.rand(4)
    with devrng.fork_rng():
        torch.rand(100)
    b = torch.rand(4)
    devrng.manual_seed(123)
    assert torch.equal(torch.rand(4), a)
    assert torch.equal(torch.rand(4), b)  # the fork left the CPU generator where it was
    assert "xpu" not in devrng.get_rng_state().devices
    assert ipex_queues._queued_calls == []
    assert ipex_queues._lazy_seed_tracker.get_calls() == []


def test_deterministic_with_ipex_imported_sets_and_restores() -> None:
    before = current_settings()
    entry = before["backend.xpu.deterministic"]
    # IPEX is loaded, but its CPU build has no oneDNN switch: nothing to set, and said so.
    assert entry["available"] is False
    assert entry["value"] is None
    with devrng.deterministic(seed=1) as handle:
        report = handle.report()
        assert report["torch.backends.mkldnn.deterministic"]["value"] is True
        assert report["backend.xpu.deterministic"]["available"] is False
        assert torch.are_deterministic_algorithms_enabled()
    after = current_settings()
    assert {k: v["value"] for k, v in after.items()} == {k: v["value"] for k, v in before.items()}


# -- the command line with IPEX ---------------------------------------------------------
def test_doctor_lists_ipex_and_its_known_problem(capsys: Any) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"intel_extension_for_pytorch    {ipex.__version__.split('+')[0]}" in out
    assert "IPEX is no longer developed after 2.8; devrng uses native torch.xpu." in out
    # This torch has no XPU, and IPEX's CPU build adds none: xpu is not a row that could work.
    assert "xpu (this torch is built without XPU)" in out
    assert not any(line.split()[:1] == ["xpu"] for line in out.splitlines())
    assert "imports only with torch" not in out  # IPEX and torch match here


def test_doctor_all_shows_xpu_as_not_available(capsys: Any) -> None:
    assert main(["doctor", "--all"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    xpu = [row for row in rows if row[:1] == ["xpu"]]
    assert len(xpu) == 1 and "available" in xpu[0] and "not" in xpu[0], xpu


def test_selftest_with_ipex_imported_passes_and_skips_xpu(capsys: Any, ipex_queues: Any) -> None:
    assert main(["selftest"]) == 0
    out = capsys.readouterr().out
    assert "cpu         fork        pass" in out
    assert not any(line.startswith("xpu ") for line in out.splitlines())
    assert "xpu: this torch is built without XPU" in out
    assert out.rstrip().endswith("0 failed")
    assert ipex_queues._queued_calls == []


# -- IPEX's own xpu RNG functions, which devrng does not call ----------------------------
def test_ipex_own_xpu_rng_raises_on_read_and_queues_writes(ipex_queues: Any) -> None:
    # Why devrng keeps to torch.xpu: on this build IPEX's functions fail or never run.
    with pytest.raises(AssertionError, match="IPEX not compiled with XPU enabled"):
        ipex.xpu.get_rng_state(0)
    ipex.xpu.manual_seed_all(7)
    assert ipex_queues._lazy_seed_tracker.manual_seed_all_cb is not None
    ipex.xpu.set_rng_state(torch.get_rng_state(), 0)
    assert len(ipex_queues._queued_calls) == 1
    assert not ipex.xpu.is_initialized()

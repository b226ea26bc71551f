"""The backend registry: registration, lookup, lazy entries, entry points, PrivateUse1."""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests._fakes import HAS_XLA, MinimalBackend
from tests._helpers import extra_install_command, install_plugin, run_python
from tests._internals import registry, unregister_backend

import devrng


@pytest.fixture
def clean_registry() -> Iterator[None]:
    """Backends a test registers are removed after it."""
    before = set(registry)
    yield
    for name in set(registry) - before:
        unregister_backend(name)


def test_builtin_names_are_registered() -> None:
    assert {"cpu", "cuda", "xpu", "mps", "xla", "jax"} <= set(registry)
    assert devrng.get_backend("cpu").device_count() == 1
    assert "cpu" in devrng.available_backends()


def test_registry_view_is_read_only() -> None:
    with pytest.raises(TypeError):
        registry["mine"] = MinimalBackend()  # type: ignore[index]


def test_register_object_and_refuse_a_taken_name(clean_registry: None) -> None:
    backend = MinimalBackend()
    devrng.register_backend("thirdparty", backend)
    assert devrng.get_backend("thirdparty") is backend
    with pytest.raises(ValueError, match=r"A backend named 'thirdparty' is already registered; "
                       r"pass clobber=True"):
        devrng.register_backend("thirdparty", MinimalBackend())
    other = MinimalBackend()
    devrng.register_backend("thirdparty", other, clobber=True)
    assert devrng.get_backend("thirdparty") is other


def test_register_lazy_string_is_imported_on_first_use(clean_registry: None, tmp_path: Path,
                                                       monkeypatch: Any) -> None:
    (tmp_path / "lazy_backend_pkg.py").write_text(textwrap.dedent("""
        from tests._fakes import MinimalBackend
        backend = MinimalBackend()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    devrng.register_backend("thirdparty", "lazy_backend_pkg:backend")
    assert "lazy_backend_pkg" not in sys.modules
    assert devrng.get_backend("thirdparty").device_count() == 2
    assert "lazy_backend_pkg" in sys.modules


def test_missing_package_gives_an_install_hint(clean_registry: None) -> None:
    devrng.register_backend("ghost", "devrng_no_such_package.rng:backend")
    with pytest.raises(ImportError, match=r"needs the 'devrng_no_such_package' package.*"
                       r"pip install devrng_no_such_package"):
        devrng.get_backend("ghost")


@pytest.mark.skipif(HAS_XLA,
                    reason="checks the hint where torch_xla is absent (core env)")
def test_missing_torch_xla_hint_names_the_extra() -> None:
    unregister_backend("xla")  # back to the built-in lazy entry
    # devrng is not on a package index: the hint installs what its extra holds.
    with pytest.raises(ImportError, match=r"install it \(devrng's 'xla' extra\) with: "
                                          + re.escape(extra_install_command("xla")) + "$"):
        devrng.get_backend("xla")


def test_unknown_name_lists_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"No devrng backend is registered for device type "
                       r"'nosuch'; registered: .*cpu.*xla.*register_backend"):
        devrng.get_backend("nosuch")


@pytest.mark.parametrize(("name", "backend", "error", "message"), [
    ("", MinimalBackend(), ValueError, r"Backend name '' is not valid"),
    ("a:b", MinimalBackend(), ValueError, r"Backend name 'a:b' is not valid"),
    ("x", "no_colon", ValueError, r"Backend target 'no_colon' is not of the form 'module:attr'"),
    ("x", object(), TypeError, r"does not satisfy devrng.Backend: it lacks name, is_available"),
    ("x", MinimalBackend(), ValueError, r"says its name is 'thirdparty' but is registered as 'x'"),
])
def test_bad_registrations(name: str, backend: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        devrng.register_backend(name, backend)


def test_minimal_third_party_backend_works_everywhere(clean_registry: None) -> None:
    backend = MinimalBackend()
    devrng.register_backend("thirdparty", backend)
    assert "thirdparty" in devrng.available_backends()
    assert devrng.infer_device_types(["thirdparty:1"]) == ("thirdparty",)
    snap = devrng.get_rng_state(devices=["thirdparty:0", "thirdparty:1"])
    draws = [torch.rand(2, generator=g) for g in backend.gens]
    devrng.set_rng_state(snap)
    assert all(torch.equal(d, torch.rand(2, generator=g)) for d, g in zip(draws, backend.gens, strict=True))
    with devrng.fork_rng(devices=["thirdparty:1"]):
        inside = torch.rand(2, generator=backend.gens[1])
    assert torch.equal(inside, torch.rand(2, generator=backend.gens[1]))
    devrng.manual_seed(5)  # seeds every available backend, this one included
    assert torch.equal(backend.gens[0].get_state(), torch.Generator().manual_seed(5).get_state())


def test_entry_points_register_backends(tmp_path: Path) -> None:
    env = install_plugin(tmp_path, "plugdev = plugin_mod:backend",
                         "from tests._fakes import MinimalBackend\n"
                         "backend = MinimalBackend()\nbackend.name = 'plugdev'\n")
    code = ("import devrng; print(devrng.available_backends()); "
            "print(devrng.get_backend('plugdev').device_count())")
    out = run_python(code, env=env)
    assert out.returncode == 0, out.stderr
    assert "'plugdev'" in out.stdout.splitlines()[0]
    assert out.stdout.splitlines()[1] == "2"


def test_privateuse1_device_module_is_picked_up() -> None:
    code = textwrap.dedent("""
        import types, torch, devrng
        gens = [torch.Generator().manual_seed(3)]
        mod = types.SimpleNamespace(
            is_available=lambda: True, device_count=lambda: 1, current_device=lambda: 0,
            get_rng_state=lambda i=0: gens[0].get_state(),
            set_rng_state=lambda s, i=0: gens[0].set_state(s),
            manual_seed_all=lambda s: gens[0].manual_seed(s))
        torch.utils.rename_privateuse1_backend("npu")
        torch._register_device_module("npu", mod)
        print("npu" in devrng.available_backends())
        with devrng.fork_rng(devices=["npu:0"]):
            a = torch.rand(3, generator=gens[0])
        print(torch.equal(a, torch.rand(3, generator=gens[0])))
    """)
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]

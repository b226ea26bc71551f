"""``devrng doctor`` and ``devrng selftest`` (also ``python -m devrng``)."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import platform
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

import devrng
from devrng._determinism import current_settings
from devrng._draw import draw
from devrng._registry import (
    backend_names,
    is_initialized,
    loaded_backend,
    package_installed,
    requirement,
)

_PACKAGES = ("torch", "numpy", "torch_xla", "torchax", "jax", "jaxlib",
             "intel_extension_for_pytorch", "lightning", "accelerate")
_ENV_VARS = ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "CUDA_VISIBLE_DEVICES",
             "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "PJRT_DEVICE", "XLA_FLAGS",
             "RANK", "WORLD_SIZE", "LOCAL_RANK")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None


def _release(version: str | None) -> tuple[int, ...]:
    if version is None:
        return ()
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def known_problems(versions: dict[str, str | None]) -> list[str]:
    """Problems of the installed versions that devrng works around, one sentence each."""
    out = []
    torch_v = _release(versions.get("torch"))
    if torch_v and torch_v < (2, 13):
        out.append(f"torch {versions['torch']}: torch.random.fork_rng() forks 'cuda' by default "
                   "and ignores the device types of `devices`; use devrng.fork_rng.")
    if torch_v and torch_v < (2, 4) and versions.get("intel_extension_for_pytorch"):
        out.append("torch < 2.4 has no torch.xpu; devrng falls back to IPEX's xpu module.")
    if versions.get("torch_xla"):
        out.append("torch_xla: torch.manual_seed does not seed XLA devices, and "
                   "torch.random.fork_rng cannot fork them; devrng.manual_seed / fork_rng do.")
        out.append("torch_xla: torch.utils.checkpoint fails on XLA tensors (torch has no "
                   "torch.xla module) unless devrng.patch_torch() is called.")
    tx = versions.get("torchax")
    if tx and _release(tx) <= (0, 0, 13):
        out.append(f"torchax {tx}: interop.jax_jit bakes the PRNG key into the compiled program "
                   "(the same dropout mask every call, pytorch/xla#8636); use devrng.seeded_jit.")
    if versions.get("intel_extension_for_pytorch"):
        out.append("IPEX is no longer developed after 2.8; devrng uses native torch.xpu first.")
    return out


def doctor() -> int:
    versions = {p: _version(p) for p in _PACKAGES}
    versions["devrng"] = devrng.__version__
    print(f"devrng {devrng.__version__} on Python {platform.python_version()} "
          f"({platform.system()} {platform.machine()})")
    print("\nPackages:")
    for name, v in versions.items():
        if name != "devrng":
            print(f"  {name:30} {v or '-'}")
    print("\nBackends (a package nobody imported is not imported to check):")
    print(f"  {'name':12} {'installed':10} {'available':10} {'initialised':12} devices")
    for name in backend_names():
        backend = loaded_backend(name)
        if backend is None:
            req = requirement(name)
            installed = "yes" if req is None or package_installed(req) else "no"
            print(f"  {name:12} {installed:10} {'not loaded':10} {'-':12} -")
            continue
        try:
            available = backend.is_available()
            initialised = available and is_initialized(backend)
            count = str(backend.device_count()) if initialised else "-"
        except Exception as err:
            print(f"  {name:12} {'yes':10} error: {err}")
            continue
        print(f"  {name:12} {'yes':10} {'yes' if available else 'no':10} "
              f"{'yes' if initialised else 'no':12} {count}")
    print("\nDeterminism settings:")
    print(f"  {'setting':52} {'now':20} {'deterministic()':16} available")
    for key, setting in current_settings().items():
        print(f"  {key:52} {setting['value']!s:20} {setting['target']!s:16} "
              f"{'yes' if setting['available'] else 'no'}")
    print("\nEnvironment variables:")
    for var in _ENV_VARS:
        print(f"  {var:25} {os.environ.get(var, '(unset)')}")
    print("\nKnown problems of the installed versions:")
    problems = known_problems(versions)
    for line in problems or ["none known"]:
        print(f"  - {line}")
    return 0


# -- selftest ----------------------------------------------------------------------

def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _check_fork(name: str) -> None:
    devices = [] if name == "cpu" else [f"{name}:0"]
    snap = devrng.get_rng_state(devices=devices, python=False, numpy=False)
    expected = draw(name)
    devrng.set_rng_state(snap)
    with devrng.fork_rng(devices=devices):
        inner = draw(name)
        draw("cpu")
    after = draw(name)
    if expected is None:  # no draw on this device type: move its state by seeding instead
        with devrng.fork_rng(devices=devices):
            devrng.manual_seed(98765, device_type=[name])
        if devrng.get_rng_state(devices=devices, python=False, numpy=False) != snap:
            raise AssertionError(f"{name}: state after fork_rng differs from state before")
        return
    if not _equal(inner, expected):
        raise AssertionError(f"{name}: draws inside fork_rng differ from the same draws outside")
    if not _equal(after, expected):
        raise AssertionError(f"{name}: state after fork_rng differs from state before")


def _check_snapshot(name: str) -> None:
    devices = [] if name == "cpu" else [f"{name}:0"]
    snap = devrng.get_rng_state(devices=devices)
    first = draw(name)
    devrng.set_rng_state(snap)
    again = draw(name)
    if first is None:  # no draw on this device type: compare states instead
        devrng.manual_seed(98765, device_type=[name])
        moved = devrng.get_rng_state(devices=devices)
        devrng.set_rng_state(snap)
        if moved == snap:
            raise AssertionError(f"{name}: manual_seed did not change the state")
        if devrng.get_rng_state(devices=devices) != snap:
            raise AssertionError(f"{name}: state did not round-trip through set_rng_state")
        return
    if not _equal(first, again):
        raise AssertionError(f"{name}: draws after set_rng_state differ from the first draws")
    restored = devrng.RNGState.from_dict(snap.to_dict())
    if restored.fingerprint() != snap.fingerprint():
        raise AssertionError(f"{name}: snapshot changed through to_dict/from_dict")


def _check_seed(name: str) -> None:
    types = None if name == "cpu" else [name]
    devrng.manual_seed(1234, device_type=types)
    a = draw(name)
    devrng.manual_seed(1234, device_type=types)
    b = draw(name)
    devrng.manual_seed(4321, device_type=types)
    c = draw(name)
    if a is None:  # no draw on this device type: compare the seeded states
        devices = [f"{name}:0"]
        devrng.manual_seed(1234, device_type=types)
        a = devrng.get_rng_state(devices=devices, python=False, numpy=False).devices[name][0]
        devrng.manual_seed(4321, device_type=types)
        c = devrng.get_rng_state(devices=devices, python=False, numpy=False).devices[name][0]
        devrng.manual_seed(1234, device_type=types)
        b = devrng.get_rng_state(devices=devices, python=False, numpy=False).devices[name][0]
    if not _equal(a, b) or _equal(a, c):
        raise AssertionError(f"{name}: manual_seed does not make draws reproducible")


_JIT_BACKENDS = {"cpu": "eager", "xla": "torch_xla", "jax": "torchax"}


def _host(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of a CPU, XLA or torchax tensor."""
    if t.device.type == "jax":
        import numpy as np

        return torch.from_numpy(np.asarray(t.jax()).copy())  # type: ignore[attr-defined]
    return t.cpu()


def _check_jit(name: str) -> None:
    backend = _JIT_BACKENDS.get(name)
    if backend is None:
        raise _Skip(f"seeded_jit has no compiler for {name} devices here")
    if name == "jax":
        import torchax

        with torchax.default_env():
            x = torch.ones(64, device="jax")
    else:
        x = torch.ones(64, device=f"{name}:0" if name != "cpu" else "cpu")

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x, 0.5, training=True)

    step = devrng.seeded_jit(fn, backend=backend, seed=0)
    devices = [] if name == "cpu" else [f"{name}:0"]
    before = devrng.get_rng_state(devices=devices, python=False, numpy=False)
    a, b, c = (_host(step(x, seed=s)) for s in (3, 3, 4))
    if not torch.equal(a, b) or torch.equal(a, c):
        raise AssertionError(f"seeded_jit({backend}): equal seeds must give equal draws, "
                             "different seeds different ones")
    if devrng.get_rng_state(devices=devices, python=False, numpy=False) != before:
        raise AssertionError(f"seeded_jit({backend}) changed the caller's RNG state")


class _Skip(Exception):
    pass


_CHECKS: dict[str, Callable[[str], None]] = {
    "fork": _check_fork,
    "snapshot": _check_snapshot,
    "seed": _check_seed,
    "seeded_jit": _check_jit,
}


def selftest() -> int:
    # Backends count once their package is imported: import what is installed.
    for package in ("torch_xla", "torchax"):
        if package_installed(package):
            try:
                importlib.import_module(package)
            except Exception as err:
                print(f"note: {package} is installed but failed to import: {err}")
    names = devrng.available_backends()
    outer = devrng.get_rng_state(devices=[f"{n}:0" for n in names if n != "cpu"])
    rows, failed = [], 0
    try:
        for name in names:
            for check, fn in _CHECKS.items():
                try:
                    fn(name)
                    result = "pass"
                except _Skip as why:
                    result = f"skip ({why})"
                except Exception as err:
                    result = f"FAIL: {type(err).__name__}: {err}"
                    failed += 1
                rows.append((name, check, result))
    finally:
        devrng.set_rng_state(outer)
    width = max(len("backend"), *(len(n) for n, _, _ in rows))
    print(f"{'backend':{width}}  {'check':10}  result")
    for name, check, result in rows:
        print(f"{name:{width}}  {check:10}  {result}")
    passed = sum(r == "pass" for _, _, r in rows)
    print(f"\n{passed} passed, {failed} failed")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devrng", description=devrng.__doc__.splitlines()[0]
                                     if devrng.__doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="backends, versions, settings and known problems")
    sub.add_parser("selftest", help="fork, snapshot, seeding and seeded_jit round trips")
    args = parser.parse_args(argv)
    return doctor() if args.command == "doctor" else selftest()


if __name__ == "__main__":
    sys.exit(main())

"""``devrng doctor`` and ``devrng selftest``: what the command line runs (see ``__main__``).

Both report environmental problems (a backend that fails to load or to run, a
broken plugin, an unset ``PJRT_DEVICE``) as rows and lines, never tracebacks.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

import devrng
from devrng._backends.draw import draw
from devrng._backends.registry import (
    backend_names,
    broken_backends,
    device_count,
    install_command,
    install_extra,
    is_initialized,
    loaded_backend,
    package_installed,
    requirement,
)
from devrng._base import bytecode, sigint
from devrng._base.errors import DevRNGError
from devrng._base.seeds import SEED_VARIABLES, seed_from_environment
from devrng._portable.threefry_cpu import status as kernel_status
from devrng._portable.threefry_cpu import switched_off as kernel_switched_off
from devrng._training.determinism import CUBLAS_DETERMINISTIC, current_settings
from devrng._versions import Problem, release, version_problems

__all__ = ["doctor", "known_problems", "selftest", "why_not_imported"]

_PACKAGES = ("torch", "numpy", "torch_xla", "torchax", "jax", "jaxlib", "flax",
             "intel_extension_for_pytorch", "lightning", "accelerate", "transformers", "torchdata")
_ENV_VARS = ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "CUDA_VISIBLE_DEVICES",
             "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "PJRT_DEVICE", "XLA_FLAGS",
             "RANK", "WORLD_SIZE", "LOCAL_RANK", "DEVRNG_SEED", "PL_GLOBAL_SEED",
             "DEVRNG_CPU_KERNEL", "DEVRNG_DEFER_SIGINT")
# Device packages that back a backend and are imported only when a program uses them.
_DEVICE_PACKAGES = {"xla": "torch_xla", "jax": "torchax"}
# The two values with which cuBLAS sums in one fixed order; torch's deterministic mode
# accepts exactly these. (deterministic() holds them too; tests/test_cli.py checks that
# doctor and deterministic() agree on every value.)


def _out(line: str = "") -> None:
    print(line, flush=True)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None


def known_problems(versions: dict[str, str | None]) -> list[str]:
    """Problems of the installed versions that devrng works around, one sentence each."""
    out = []
    torch_v = release(versions.get("torch"))
    if torch_v and torch_v < (2, 13):
        out.append(f"torch {versions['torch']}: torch.random.fork_rng() forks 'cuda' by default "
                   "and ignores the device types of `devices`; use devrng.fork_rng.")
    if versions.get("torch_xla"):
        out.append("torch_xla: torch.manual_seed does not seed XLA devices, and "
                   "torch.random.fork_rng cannot fork them; devrng.manual_seed / fork_rng do.")
        out.append("torch_xla: torch.utils.checkpoint fails on XLA tensors (torch has no "
                   "torch.xla module) unless devrng.patch_torch() is called.")
    tx = versions.get("torchax")
    if tx and release(tx) <= (0, 0, 13):
        out.append(f"torchax {tx}: interop.jax_jit bakes the PRNG key into the compiled program "
                   "(the same dropout mask every call, pytorch/xla#8636); use devrng.seeded_jit.")
    if versions.get("intel_extension_for_pytorch"):
        out.append("IPEX is no longer developed after 2.8; devrng uses native torch.xpu.")
    return out


def copy_shipped_by(package: str, versions: dict[str, str | None]) -> str | None:
    """The distribution that put ``package`` on the path when ``package``'s own distribution
    is not installed, else None. torch_xla 2.9's wheel ships a ``torchax`` folder that pip
    does not list: it needs JAX and flax, which nothing installed, and the user never asked
    for torchax. Such a copy is reported as such, never imported or failed over."""
    if versions.get(package) or not package_installed(package):
        return None
    owners = importlib.metadata.packages_distributions().get(package, [])
    return ", ".join(sorted(set(owners))) or "another package"


def _load_installed(versions: dict[str, str | None]) -> dict[str, str]:
    """Import the installed device packages; name -> why it failed, for those that did."""
    failed = {}
    for name, package in _DEVICE_PACKAGES.items():
        if (package_installed(package) and package not in sys.modules
                and not copy_shipped_by(package, versions)):
            try:
                importlib.import_module(package)
            except Exception as err:
                failed[name] = why_not_imported(package, err, versions)
    return failed


def why_not_imported(package: str, err: Exception, versions: dict[str, str | None]) -> str:
    """A sentence for a device package's failed import: the version problem that explains
    it, else what the error means, never a raw linker symbol."""
    shown = f"{package} {versions.get(package) or ''}".rstrip()
    if any(p.package == package and p.error for p in version_problems(versions)):
        return f"{shown} does not import with torch {versions.get('torch')}: the fix is " \
               "under 'Problems in this environment'"
    text = str(err)
    if "undefined symbol" in text:
        return f"{shown} does not import: its compiled library was built against another " \
               f"torch than the installed {versions.get('torch')}; reinstall {package} " \
               "for this torch"
    missing = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
    if missing:
        return f"{shown} does not import: it needs the module {missing!r}, which is not " \
               f"installed (run: pip install {missing.split('.')[0]})"
    return f"{shown} is installed but failed to import: {type(err).__name__}: {_first_line(err)}"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else ""


def _buildable(name: str) -> tuple[bool, str]:
    """Whether this torch build can have devices of type ``name``, and if not, why."""
    if name == "cuda" and not torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
        return False, "this torch is built without CUDA"
    if name == "mps" and not torch.backends.mps.is_built():
        return False, "this torch is built without MPS (Apple GPUs)"
    # devrng uses torch.xpu (in every torch >= 2.8 build); an installed IPEX adds no
    # XPU to a torch built without one (its PyPI wheel is a CPU-only build).
    if name == "xpu" and not getattr(torch.xpu, "_is_compiled", lambda: True)():
        return False, "this torch is built without XPU"
    return True, ""


def _works(name: str, backend: Any) -> str:
    """Check one backend for real: its device count, a draw, a state round trip."""
    count = device_count(backend)
    if count == 0:
        return "no device"
    state = backend.get_rng_state(0)
    first = draw(name)
    backend.set_rng_state(state, 0)
    again = draw(name)
    if first is not None and (again is None or not torch.equal(first, again)):
        return "FAIL: a draw did not repeat after its state was put back"
    checked = "a draw and a state round trip" if first is not None else "a state round trip"
    return f"works ({count} device{'s' if count != 1 else ''}; {checked})"


def _backend_rows(load: bool, everything: bool, versions: dict[str, str | None]
                  ) -> tuple[list[tuple[str, ...]], list[str]]:
    rows: list[tuple[str, ...]] = []
    hidden: list[str] = []
    load_failed = _load_installed(versions) if load else {}
    for name in backend_names():
        package = requirement(name)
        version = _version(package) if package else None
        package_text = f"{package} {version}" if version else (package or "torch")
        can, why = _buildable(name)
        if not can and not everything:
            hidden.append(f"{name} ({why})")
            continue
        if package and not package_installed(package):
            rows.append((name, f"{package} (not installed)", "-", install_command(name) or ""))
            continue
        owner = copy_shipped_by(package, versions) if package else None
        if package and owner:
            rows.append((name, f"{package} (not installed)", "-", _copy_note(package, owner, name)))
            continue
        if name in load_failed:
            rows.append((name, package_text, "FAIL", load_failed[name]))
            continue
        backend = loaded_backend(name)  # a plugin that fails here is recorded as broken
        broken = broken_backends()
        if name in broken:
            rows.append((name, "plugin", "broken", broken[name]))
            continue
        if backend is None:
            if package:
                rows.append((name, package_text, "not loaded",
                             f"nothing has imported {package}; `devrng doctor --load` checks it"))
            else:
                rows.append((name, package_text, "-", why or "no backend could be loaded"))
            continue
        try:
            if not backend.is_available():
                rows.append((name, package_text, "not available", why or "no device here"))
                continue
            started = is_initialized(backend)
            if load:
                status, note = "available", _works(name, backend)
            elif started:
                count = device_count(backend)
                status, note = "available", f"started, {count} device{'s' if count != 1 else ''}"
            else:
                status, note = "available", "not started yet (devrng never starts it)"
        except Exception as err:
            status, note = "FAIL", f"{type(err).__name__}: {_first_line(err)}"
        rows.append((name, package_text, status, note))
    return rows, hidden


def _copy_note(package: str, owner: str, name: str) -> str:
    return (f"only the copy of {package} that {owner} ships, which is not installed as a "
            f"package of its own and is not used; devrng's {install_extra(name)} extra "
            f"installs it with what it imports: {install_command(name)}")


def _table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        _out("  " + "  ".join([*cells, row[-1]]).rstrip())


def _setting_text(value: Any, available: bool) -> str:
    if not available:
        return "n/a"
    if isinstance(value, tuple) and len(value) == 2:  # use_deterministic_algorithms
        return ("on" if value[0] else "off") + (", warn only" if value[1] else "")
    if isinstance(value, bool):
        return "on" if value else "off"
    return "(unset)" if value is None else str(value)


def environment_problems(versions: dict[str, str | None], environ: Mapping[str, str] | None = None
                         ) -> tuple[list[str], list[str]]:
    """Problems of this environment's settings (not of package versions), each with its fix;
    ``environ`` is the user's environment (default ``os.environ``).

    Returns (errors, warnings): an error makes a devrng call fail (``TrainingRNG()`` on
    a seed variable that holds no seed); a warning makes results differ between runs
    or devices.
    """
    environ = os.environ if environ is None else environ
    errors, warnings = [], []
    for variable in SEED_VARIABLES:
        raw = environ.get(variable, "")
        if raw.strip():
            try:
                seed_from_environment(variable, raw)
            except ValueError as err:
                errors.append(f"{err} TrainingRNG() and the trainer callbacks read it when "
                              "given no seed, and raise on it.")
    try:
        kernel_switched_off()
    except DevRNGError as err:
        errors.append(f"{err} devrng.portable raises this at its first draw on the CPU.")
    cublas = environ.get("CUBLAS_WORKSPACE_CONFIG")
    if cublas is not None and cublas not in CUBLAS_DETERMINISTIC:
        warnings.append(
            f"CUBLAS_WORKSPACE_CONFIG is {cublas!r}, with which cuBLAS may sum in another order "
            "on every run (and torch's deterministic mode refuses cuBLAS ops); unset it "
            "(devrng.deterministic() sets ':4096:8' when it runs before CUDA starts) or set "
            "CUBLAS_WORKSPACE_CONFIG=:4096:8.")
    if versions.get("torch_xla") and not environ.get("PJRT_DEVICE"):
        warnings.append("torch_xla is installed but PJRT_DEVICE is not set: torch_xla then picks "
                        "a device itself (it may look for a TPU); set PJRT_DEVICE=CPU, TPU or "
                        "CUDA.")
    return errors, warnings


@contextlib.contextmanager
def _stderr_held(held: list[str]) -> Iterator[None]:
    """Keep what the block writes to stderr (Python warnings, loggers, C++ libraries
    writing to file descriptor 2) out of the report's tables; ``held`` gets it afterwards."""
    sys.stderr.flush()
    with tempfile.TemporaryFile(mode="w+b") as buffer:
        saved = os.dup(2)
        os.dup2(buffer.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            buffer.seek(0)
            held.append(buffer.read().decode("utf-8", errors="replace"))


def doctor(*, load: bool = False, everything: bool = False) -> int:
    """Print the report; 0 unless a backend that was checked with ``load`` fails."""
    users = dict(os.environ)  # before loading: torch_xla sets PJRT_DEVICE and XLA_FLAGS itself
    versions = {p: _version(p) for p in _PACKAGES}
    _out(f"devrng {devrng.__version__} on Python {platform.python_version()} "
         f"({platform.system()} {platform.machine()})")
    _out("\nPackages:")
    for name, v in versions.items():
        _out(f"  {name:30} {v or '-'}")
    _out("\nBackends:" if load else "\nBackends (installed device packages are not imported; "
         "`devrng doctor --load` imports and checks them):")
    held: list[str] = []
    # Loading torch_xla or a plugin may print warnings of its own: after the table, not in it.
    with _stderr_held(held) if load else contextlib.nullcontext():
        rows, hidden = _backend_rows(load, everything, versions)
    _table(rows, ("backend", "package", "status", "notes"))
    if hidden:
        _out(f"  (not listed: {'; '.join(hidden)}; `devrng doctor --all` lists them)")
    printed = "".join(held).strip()
    if printed:
        _out("\nPrinted while loading the backends (by the packages themselves):")
        for line in printed.splitlines():
            _out(f"  | {line}")
    _out("\nDeterminism settings:")
    # A backend's own switch that this process does not have is noise, not a setting.
    settings = [(key, _setting_text(s["value"], s["available"]),
                 _setting_text(s["target"], s["available"]))
                for key, s in current_settings().items()
                if s["available"] or not key.startswith("backend.")]
    _table(settings, ("setting", "now", "deterministic() sets"))
    in_use, why = kernel_status()
    _out("\nPortable streams (devrng.portable) on the CPU:")
    _out(f"  fused C kernel {'in use' if in_use else 'NOT in use'}: {why}")
    _out("\nInterrupts (Ctrl-C) inside devrng calls:")
    _out(f"  {_interrupt_guard()}")
    _out("\nEnvironment variables:")
    for var in _ENV_VARS:  # the user's values; what loading a package changed, beside them
        now = os.environ.get(var)
        loaded = "" if now == users.get(var) else (
            f"  (loading the backends {'unset it' if now is None else f'set it to {now!r}'})")
        _out(f"  {var:25} {users.get(var, '(unset)')}{loaded}")
    errors, warnings = environment_problems(versions, users)
    mismatched = version_problems(versions)
    if errors or warnings or mismatched:
        _out("\nProblems in this environment:")
        for problem in mismatched:
            _print_problem(problem)
        for line in errors:
            _out(f"  - ERROR: {line}")
        for line in warnings:
            _out(f"  - {line}")
    _out("\nKnown problems of the installed versions:")
    for line in known_problems(versions) or ["none known"]:
        _out(f"  - {line}")
    failed = any(row[2] == "FAIL" for row in rows)
    return 1 if (load and failed) or errors or any(p.error for p in mismatched) else 0


def _interrupt_guard() -> str:
    """Whether a Ctrl-C inside a devrng call waits for the call to end, and if not, why."""
    if sigint.installed():
        return "guarded: one that lands inside a devrng call is raised when the call ends"
    if os.environ.get("DEVRNG_DEFER_SIGINT", "1").strip() == "0":
        why = "DEVRNG_DEFER_SIGINT=0"
    elif not bytecode.tested():
        tested = ", ".join(".".join(map(str, v)) for v in bytecode.TESTED)
        why = (f"devrng reads CPython's bytecode to guard its calls, and that reading is tested "
               f"on Python {tested}, not on {platform.python_implementation()} "
               f"{platform.python_version()}")
    else:
        why = "another SIGINT handler was installed before devrng (or this is not the main thread)"
    return f"NOT guarded ({why}): a Ctrl-C may leave a devrng call half done"


def _print_problem(problem: Problem) -> None:
    _out(f"  - {'ERROR: ' if problem.error else ''}{problem.text}")
    _out(f"    run: {problem.fix}")


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
    # The CPU alone for "cpu": another backend's failure must not show up on its row.
    cover: dict[str, Any] = {"devices": []} if name == "cpu" else {"device_type": [name]}
    devrng.manual_seed(1234, **cover)
    a = draw(name)
    devrng.manual_seed(1234, **cover)
    b = draw(name)
    devrng.manual_seed(4321, **cover)
    c = draw(name)
    if a is None:  # no draw on this device type: compare the seeded states
        devices = [f"{name}:0"]
        devrng.manual_seed(1234, **cover)
        a = devrng.get_rng_state(devices=devices, python=False, numpy=False).devices[name][0]
        devrng.manual_seed(4321, **cover)
        c = devrng.get_rng_state(devices=devices, python=False, numpy=False).devices[name][0]
        devrng.manual_seed(1234, **cover)
        b = devrng.get_rng_state(devices=devices, python=False, numpy=False).devices[name][0]
    if not _equal(a, b) or _equal(a, c):
        raise AssertionError(f"{name}: manual_seed does not make draws reproducible")


_JIT_BACKENDS = {"cpu": "eager", "xla": "torch_xla", "jax": "torchax"}


def _to_cpu(t: torch.Tensor) -> torch.Tensor:
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
    a, b, c = (_to_cpu(step(x, seed=s)) for s in (3, 3, 4))
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
    """Run every check on every available backend, printing each row as it finishes."""
    load_failed = _load_installed({p: _version(p) for p in _PACKAGES})
    names = devrng.available_backends()
    skipped = _skipped(names, load_failed)
    _out(f"{'backend':10}  {'check':10}  result")
    failed = passed = 0
    for name, why in load_failed.items():
        _out(f"{name:10}  {'import':10}  FAIL: {why}")
        failed += 1
    for name, why in broken_backends().items():  # installed, but it fails to count its devices
        if name not in names and name not in load_failed:
            _out(f"{name:10}  {'devices':10}  FAIL: {why}")
            failed += 1
    for name in names:
        try:
            outer = devrng.get_rng_state(devices=[] if name == "cpu" else [f"{name}:0"])
        except Exception as err:
            _out(f"{name:10}  {'start':10}  FAIL: {type(err).__name__}: {_first_line(err)}")
            failed += 1
            continue
        try:
            for check, fn in _CHECKS.items():
                try:
                    fn(name)
                    result = "pass"
                    passed += 1
                except _Skip as why:
                    result = f"skip ({why})"
                except Exception as err:
                    result = f"FAIL: {type(err).__name__}: {_first_line(err)}"
                    failed += 1
                _out(f"{name:10}  {check:10}  {result}")
        finally:
            try:
                devrng.set_rng_state(outer)
            except Exception as err:
                _out(f"{name:10}  {'restore':10}  FAIL: {type(err).__name__}: {_first_line(err)}")
                failed += 1
    if skipped:
        _out("\nNot tested here:")
        for line in skipped:
            _out(f"  {line}")
    _out(f"\n{passed} passed, {failed} failed")
    return 1 if failed else 0


def _skipped(tested: tuple[str, ...], load_failed: dict[str, str]) -> list[str]:
    out = []
    broken = broken_backends()
    versions = {p: _version(p) for p in _PACKAGES}
    for name in backend_names():
        if name in tested or name in load_failed:
            continue
        package = requirement(name)
        if name in broken:
            continue  # a FAIL row already
        if package and not package_installed(package):
            out.append(f"{name}: {package} is not installed")
        elif package and (owner := copy_shipped_by(package, versions)):
            out.append(f"{name}: {_copy_note(package, owner, name)}")
        else:
            can, why = _buildable(name)
            out.append(f"{name}: {why if not can else 'no device available in this process'}")
    return out

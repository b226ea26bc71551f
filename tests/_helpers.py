"""Helpers the whole suite shares: every generator's state in one comparable value, and one
way to run Python in a fresh process.

``generator_states`` reads torch's CPU generator, Python's ``random``, NumPy's global
generator and the generators of any fake device (``tests._fakes``) without going through
devrng, as plain bytes and tuples, so ``==`` compares them exactly.
"""

from __future__ import annotations

import io
import os
import random
import shlex
import subprocess
import sys
import textwrap
import tomllib
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent


class Generators(NamedTuple):
    """Every generator's state at one moment; compare two with ``==``."""

    cpu: bytes
    python: Any
    numpy: tuple[bytes, int, int, float]
    devices: tuple[tuple[bytes, ...], ...]  # per fake device holder, per device

    def without_devices(self, *drop: int) -> Generators:
        """The same states, leaving out the holders at positions ``drop``."""
        return self._replace(devices=tuple(d for i, d in enumerate(self.devices) if i not in drop))


def _bytes(state: torch.Tensor) -> bytes:
    return bytes(state.numpy().tobytes())


def generators_of(holder: Any) -> list[torch.Generator]:
    """The generators of a fake device holder, or the one generator it is."""
    if isinstance(holder, torch.Generator):
        return [holder]
    return list(getattr(holder, "gens", None) or holder.generators)


def generator_states(*holders: Any) -> Generators:
    """Torch's CPU, Python's and NumPy's generators, and the generators of each holder (a
    ``torch.Generator``, a ``FaultyBackend`` / ``MinimalBackend`` (``.gens``) or a
    ``SimulatedDeviceModule`` (``.generators``)), read without devrng."""
    np_state = np.random.get_state(legacy=False)
    numpy = (bytes(np_state["state"]["key"].tobytes()), int(np_state["state"]["pos"]),
             int(np_state["has_gauss"]), float(np_state["gauss"]))
    devices = tuple(tuple(_bytes(g.get_state()) for g in generators_of(h)) for h in holders)
    return Generators(_bytes(torch.get_rng_state()), random.getstate(), numpy, devices)


def set_environ(values: Mapping[str, str | None]) -> None:
    """Set environment variables, ``None`` meaning unset (to put saved values back)."""
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def run_env(env: Mapping[str, str | None] | None = None, *, inherit_env: bool = False
            ) -> dict[str, str]:
    """The environment ``run_python`` gives a child: minimal (PATH, PYTHONPATH with this
    checkout first, PJRT_DEVICE=CPU) unless ``inherit_env``; ``env`` adds to it, and a
    ``None`` value removes a variable."""
    base = dict(os.environ) if inherit_env else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "src"),
                                                       base.get("PYTHONPATH")]))
    base.setdefault("PJRT_DEVICE", "CPU")
    base.update({k: v for k, v in (env or {}).items() if v is not None})
    for key in [k for k, v in (env or {}).items() if v is None]:
        base.pop(key, None)
    return base


def aborted_after_success(proc: subprocess.CompletedProcess[str], *, finished: bool) -> bool:
    """Whether a ``torchrun`` job failed only because a rank was aborted at exit after every
    rank ``finished`` its work (the caller's evidence: their results are out): gloo's worker
    thread frees a finished work holding Python tensors while the interpreter finalizes and
    cannot take the GIL (pytorch/pytorch#190489; docs/known-issues.md). The launcher's own
    traceback (ending in ``ChildFailedError``) is the only one allowed, so a Python error in
    a rank is never taken for the abort."""
    tracebacks = proc.stderr.count("Traceback (most recent call last)")
    return (proc.returncode != 0 and finished
            and "terminate called without an active exception" in proc.stderr
            and "(SIGABRT)" in proc.stderr
            and tracebacks <= proc.stderr.count("errors.ChildFailedError"))


def run_torchrun(cmd: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float,
                 finished: Callable[[subprocess.CompletedProcess[str]], bool]
                 ) -> subprocess.CompletedProcess[str]:
    """Run a ``torchrun`` job; launched again (with a warning), up to twice, when it failed only
    by the abort at exit of ``aborted_after_success`` (``finished(proc)``: every rank's results
    are out). A launch in 100 aborts so on a quiet machine, and 1 in 8 did beside a CI run:
    one retry let two aborts in a row fail CI. A third failure is the caller's to report."""
    def launch() -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(cmd), cwd=cwd, env=dict(env), capture_output=True, text=True,
                              timeout=timeout)

    proc = launch()
    for _ in range(2):
        if not aborted_after_success(proc, finished=finished(proc)):
            break
        warnings.warn(f"launching again: a rank aborted at exit after success (pytorch/pytorch"
                      f"#190489):\n{proc.stderr[-3000:]}", stacklevel=2)
        proc = launch()
    return proc


def run_python(code: str, *, args: Sequence[str] = (),
               env: Mapping[str, str | None] | None = None, inherit_env: bool = False,
               timeout: float = 900, cwd: Path | str = ROOT, module: bool = False,
               stdout: Any = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (or, with ``module=True``, ``python -m code``) in a fresh interpreter with
    this checkout first on the path; output captured as text (``stdout``: a file instead).

    The environment is minimal (PATH, PYTHONPATH, PJRT_DEVICE=CPU) unless ``inherit_env``;
    ``env`` adds to it, and a ``None`` value removes a variable.
    """
    base = run_env(env, inherit_env=inherit_env)
    command = ["-m", code] if module else ["-c", textwrap.dedent(code)]
    streams: dict[str, Any] = ({"capture_output": True} if stdout is None
                               else {"stdout": stdout, "stderr": subprocess.PIPE})
    return subprocess.run([sys.executable, *command, *args], text=True, env=base,
                          timeout=timeout, cwd=cwd, **streams)


def fake_distribution(where: Path, name: str, version: str, *, package_source: str | None = None
                      ) -> dict[str, str]:
    """Install in ``where`` the metadata of distribution ``name`` at ``version``, as pip would
    (and, with ``package_source``, its package ``name/__init__.py``). Put first on the path, it
    is what ``importlib.metadata`` reads, also for a package installed for real (a fake
    ``torch`` version beside the real torch). Returns the environment (``PYTHONPATH``)."""
    dist = where / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if package_source is not None:
        (where / name).mkdir()
        (where / name / "__init__.py").write_text(package_source)
    return {"PYTHONPATH": f"{where}:{ROOT}:{ROOT / 'src'}"}


def extra_install_command(extra: str) -> str:
    """The pip command devrng's hints give for ``extra``: the extra's own requirements from
    pyproject.toml (devrng is not on a package index, so not ``devrng[extra]``)."""
    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"][extra]
    return "pip install " + " ".join(shlex.quote(r) for r in requirements)


def install_plugin(where: Path, entry: str, source: str, *, name: str = "devrng-plugin"
                   ) -> dict[str, str]:
    """Install a devrng backend plugin in ``where``, as pip would: the distribution ``name``,
    whose ``devrng.backends`` entry point is ``entry`` (``"name = module:attr"``), and the
    module's ``source``. Returns the environment (``PYTHONPATH``) under which Python finds it."""
    env = fake_distribution(where, name, "1.0")
    (where / f"{name.replace('-', '_')}-1.0.dist-info" / "entry_points.txt").write_text(
        f"[devrng.backends]\n{entry}\n")
    module = entry.split("=")[1].strip().split(":")[0]
    (where / f"{module}.py").write_text(source)
    return env



def resealed(state: Any) -> Any:
    """``state`` -- a saved state a test changed a piece of -- with the digest of every devrng
    state in it made again, innermost first, as if devrng had written it so: loading it then
    reaches the checks behind the digest."""
    from tests import _internals

    if isinstance(state, list):
        return [resealed(item) for item in state]
    if not isinstance(state, dict):
        return state
    inner = {k: resealed(v) for k, v in state.items()}
    if "digest" not in state:
        return inner
    inner.pop("digest")
    inner.pop("devrng_version", None)
    return _internals.seal(inner)


def unsealed(state: dict[str, Any], version: int) -> dict[str, Any]:
    """``state`` as a devrng before 0.5 wrote it: version ``version``, with no digest (such
    states load unchecked)."""
    return {**{k: v for k, v in state.items() if k not in ("digest", "devrng_version")},
            "version": version}


def plain_state(state_dict: Mapping[str, Any]) -> Any:
    """The plain state inside what a devrng object's ``state_dict()`` returns,
    ``{"devrng_rank_<r>": entry}``: the entry's bytes read as ``torch.load`` reads them, or
    the entry's dict (the documented format; loading it takes the single-process path)."""
    (entry,) = state_dict.values()
    if isinstance(entry, bytes):
        return torch.load(io.BytesIO(entry), weights_only=True)
    return dict(entry)

"""Which versions work together: the table ``devrng doctor`` checks an installation against.

A device package is built for one torch: torch_xla X.Y and IPEX X.Y import only
with torch X.Y.*, torchax 0.0.13 names an aten overload that torch 2.13 removed,
and pip installs any of them beside any torch without a word (none of their
wheels says which torch it needs). The import then fails with a linker symbol or
an ``AttributeError`` that names neither package. This table says, for each
installed package, what it needs and the one command that fixes it.

``TESTED_TORCH`` is the torch releases devrng's CI runs the suite on (one
environment each, ``envs/*.txt``); tests/test_packaging.py keeps this module
equal to those files and to pyproject.toml's extras.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

__all__ = ["MIN_TORCH", "TESTED_TORCH", "Problem", "release", "version_problems"]

MIN_TORCH = (2, 8)
TESTED_TORCH = ((2, 8), (2, 9), (2, 13), (2, 14))  # oldest first


def release(version: str | None) -> tuple[int, ...]:
    """``"2.9.0+cu128"`` -> ``(2, 9, 0)``; ``None`` -> ``()``."""
    if version is None:
        return ()
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


class Problem(NamedTuple):
    """One incompatibility: what is wrong, in a sentence, and the command that fixes it."""

    package: str  # the package whose import it breaks
    error: bool  # False: it works, but not as CI tested it
    text: str
    fix: str


def _one_torch_release(package: str, why: str) -> Callable[[str, str], Problem | None]:
    """The rule of a package built for the torch of its own minor release."""
    def check(version: str, torch: str) -> Problem | None:
        if release(version)[:2] == release(torch)[:2]:
            return None
        minor = ".".join(map(str, release(version)[:2]))
        return Problem(package, True, f"{package} {version} needs torch {minor}.*, and torch "
                       f"{torch} is installed: {why}.", f"pip install 'torch=={minor}.*'")
    return check


def _torchax(version: str, torch: str) -> Problem | None:
    # 0.0.13 is the newest torchax; a later one may lift the bound, so it holds up to there.
    if release(version) > (0, 0, 13) or release(torch)[:2] < (2, 13):
        return None
    return Problem("torchax", True, f"torchax {version} needs torch older than 2.13 (CI tests "
                   f"it with 2.9), and torch {torch} is installed: `import torchax` fails, as "
                   "it names an aten overload that torch 2.13 removed.",
                   "pip install 'torch==2.9.*'")


# Import name -> the check of its version against torch's.
_TORCH_RULES: dict[str, Callable[[str, str], Problem | None]] = {
    "torch_xla": _one_torch_release("torch_xla", "`import torch_xla` fails with an undefined "
                                    "symbol, as its compiled part is built against that torch"),
    "intel_extension_for_pytorch": _one_torch_release(
        "intel_extension_for_pytorch", "`import intel_extension_for_pytorch` fails "
        "(AttributeError: module 'os' has no attribute 'exit')"),
    "torchax": _torchax,
}
# Packages a package imports without declaring them, and the command that installs them (the
# versions of pyproject.toml's extra of that package).
_UNDECLARED = {"torchax": (("jax", "flax"), "pip install 'jax>=0.10' 'flax>=0.12.8'")}


def version_problems(versions: Mapping[str, str | None]) -> list[Problem]:
    """What does not work together among the installed ``versions`` (import name -> version,
    ``None`` when absent), each with its fix; errors first."""
    torch = versions.get("torch")
    out: list[Problem] = []
    if torch is None:
        return [Problem("torch", True, "torch is not installed; devrng needs torch 2.8 or newer.",
                        "pip install torch")]
    if release(torch)[:2] < MIN_TORCH:
        out.append(Problem("torch", True, f"torch {torch} is older than devrng supports "
                           "(2.8 or newer).", "pip install 'torch>=2.8'"))
    for package, check in _TORCH_RULES.items():
        version = versions.get(package)
        problem = check(version, torch) if version else None
        if problem:
            out.append(problem)
    for package, (needed, fix) in _UNDECLARED.items():
        missing = [name for name in needed if not versions.get(name)]
        if versions.get(package) and missing:
            out.append(Problem(package, True, f"{package} {versions[package]} imports "
                               f"{' and '.join(needed)}, and {' and '.join(missing)} "
                               f"{'is' if len(missing) == 1 else 'are'} not installed: "
                               f"{package}'s package does not declare them, so pip left them out.",
                               fix))
    if not versions.get("numpy"):
        out.append(Problem("numpy", False, "NumPy is not installed: devrng cannot seed or "
                           "snapshot NumPy's generator, and `import torch` warns 'Failed to "
                           "initialize NumPy'.", "pip install numpy"))
    if release(torch)[:2] >= MIN_TORCH and release(torch)[:2] not in TESTED_TORCH:
        tested = ", ".join(".".join(map(str, v)) for v in TESTED_TORCH)
        newest = ".".join(map(str, TESTED_TORCH[-1]))
        out.append(Problem("torch", False, f"torch {torch} is not a release devrng is tested "
                           f"with ({tested}); `devrng selftest` checks the basics here.",
                           f"pip install 'torch=={newest}.*'"))
    return sorted(out, key=lambda p: not p.error)

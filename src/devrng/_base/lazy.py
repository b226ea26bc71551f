"""Import on first use, with an install hint when the package is missing.

Backends (``devrng._backends.xla``) and compilers (``devrng._jit.compilers.torchax``)
import heavy packages at their top; they are loaded through ``load`` the
first time they are needed, so ``import devrng`` stays light and a missing
package becomes one ``ImportError`` that says what to install.

``imported`` is the other direction: a module's attributes, but only if the
program has imported it already (devrng never pays for the import itself).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import shlex
import sys
from types import ModuleType
from typing import Any

__all__ = ["imported", "install_hint", "load"]


def install_hint(package: str, extra: str | None) -> str:
    """The pip command that installs ``package``: what devrng's ``extra`` holds, else ``package``.

    devrng is installed from its source tree, not from a package index, so the hint
    names the extra's own requirements (as the installed devrng declares them in
    pyproject.toml) rather than ``devrng[extra]``, which pip could not find.

    Examples:
        >>> install_hint("devrng_no_such_package", None)
        'pip install devrng_no_such_package'
    """
    requirements = _extra_requirements(extra) if extra else []
    return "pip install " + " ".join(shlex.quote(r) for r in requirements or [package])


def _extra_requirements(extra: str) -> list[str]:
    try:
        declared = importlib.metadata.requires("devrng") or []
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return []
    marker = re.compile(r";\s*extra\s*==\s*[\"']" + re.escape(extra) + r"[\"']\s*$")
    return [r.split(";")[0].strip() for r in declared if marker.search(r)]


def load(target: str, *, what: str, extra: str | None = None) -> Any:
    """The object at ``"module:attr"`` (or the module, for a bare ``"module"``).

    ``what`` names the thing being loaded for the error message, as in
    ``"The 'xla' backend"``; ``extra`` is devrng's pip extra that installs the
    missing package.

    Examples:
        >>> load("devrng._backends.cpu:backend", what="The 'cpu' backend").name
        'cpu'
    """
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        missing = err.name or module_name.split(".")[0]
        if missing.startswith("devrng."):  # our own module is missing: not an install problem
            raise
        package = missing.split(".")[0]
        raise ImportError(
            f"{what} needs the {package!r} package, which could not be imported ({err}); "
            + (f"install it (devrng's {extra!r} extra) with: " if extra else "install it with: ")
            + install_hint(package, extra)
        ) from err
    return getattr(module, attr) if attr else module


def imported(name: str) -> ModuleType | None:
    """The module ``name`` if the program has imported it (or is importing it), else None.

    A module enters ``sys.modules`` before its body runs: read from there while
    another thread is still importing it, it lacks the names defined further down
    (``AttributeError: partially initialized module``). Going through the import
    system instead waits for that import to finish, as a second ``import`` would;
    a module nobody imported is never imported here.

    Examples:
        >>> imported("devrng._base.lazy").__name__
        'devrng._base.lazy'
        >>> imported("devrng_no_such_module") is None
        True
    """
    if sys.modules.get(name) is None:  # never imported (or blocked with None)
        return None
    return importlib.import_module(name)

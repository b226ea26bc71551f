"""Import on first use, with an install hint when the package is missing.

Backends (``devrng._backends.xla``) and compilers (``devrng._compilers.torchax``)
import heavy packages at their top; they are loaded through ``load`` the
first time they are needed, so ``import devrng`` stays light and a missing
package becomes one ``ImportError`` that says what to install.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["install_hint", "load"]


def install_hint(package: str, extra: str | None) -> str:
    """The pip command that installs ``package`` (through devrng's extra when there is one)."""
    return f"pip install 'devrng[{extra}]'" if extra else f"pip install {package}"


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
            f"install it with: {install_hint(package, extra)}"
        ) from err
    return getattr(module, attr) if attr else module

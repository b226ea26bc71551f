"""A Griffe extension for the API reference: hide parameters whose names start with ``_``.

``devrng.fork_rng`` keeps torch's private ``_caller`` and ``_devices_kw`` so that it is a
drop-in for ``torch.random.fork_rng``; users never pass them, so the rendered signature
leaves them out. The code is unchanged.
"""

from __future__ import annotations

from typing import Any

import griffe


class HidePrivateParameters(griffe.Extension):
    """Remove ``_name`` parameters from the rendered signature of every function."""

    def on_function(self, *, func: griffe.Function, **kwargs: Any) -> None:
        for param in list(func.parameters):
            if param.name.startswith("_") and param.name not in ("self", "cls"):
                del func.parameters[param.name]

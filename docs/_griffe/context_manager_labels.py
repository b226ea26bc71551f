"""A Griffe extension for the API reference: label what is used with ``with``.

``devrng.fork_rng`` is a class only so that it can be entered and called; the API
page hides its "class" badge and shows it by use instead: "context manager", and
"decorator" where calling it on a function wraps that function. Functions made with
``contextlib.contextmanager`` get the "context manager" label too.
"""

from __future__ import annotations

from typing import Any

import griffe


class ContextManagerLabels(griffe.Extension):
    """Add usage labels that mkdocstrings shows next to an object's heading."""

    def on_class(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        if "__enter__" in cls.members:
            cls.labels.add("context manager")
            if "__call__" in cls.members:
                cls.labels.add("decorator")

    def on_function(self, *, func: griffe.Function, **kwargs: Any) -> None:
        if any(d.callable_path == "contextlib.contextmanager" for d in func.decorators):
            func.labels.add("context manager")

"""A Griffe extension for the API reference: label what is used with ``with``.

``devrng.fork_rng`` returns an object that is entered and called; the API page says so
next to its heading: "context manager", and "decorator" where calling the object on a
function wraps that function. Classes that can be entered, and functions made with
``contextlib.contextmanager``, get the "context manager" label too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import griffe


class ContextManagerLabels(griffe.Extension):
    """Add usage labels that mkdocstrings shows next to an object's heading."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.is_class:
                obj.labels |= _usage(obj)
            elif obj.is_function:
                if any(d.callable_path == "contextlib.contextmanager" for d in obj.decorators):
                    obj.labels.add("context manager")
                returned = getattr(obj.returns, "canonical_path", None)
                if returned is not None:  # a function that returns such a class
                    try:
                        obj.labels |= _usage(pkg.modules_collection[returned])
                    except (KeyError, griffe.AliasResolutionError):
                        pass


def _usage(cls: Any) -> set[str]:
    if not cls.is_class or "__enter__" not in cls.members:
        return set()
    return {"context manager", "decorator"} if "__call__" in cls.members else {"context manager"}


def _walk(obj: Any) -> Iterator[Any]:
    for member in obj.members.values():
        if member.is_alias:
            continue
        yield member
        if member.is_module or member.is_class:
            yield from _walk(member)

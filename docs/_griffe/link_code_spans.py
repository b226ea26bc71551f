"""A Griffe extension for the API reference: a code span that names a documented object links to it.

Docstrings are read by ``help()`` as much as by the site, so they name objects as plain
code -- ``devrng.fork_rng``, ``fork_rng``, ``RNGState.save``, ``deterministic()`` -- and
never in mkdocs' link syntax, which ``help()`` would show raw. When the site is built, a
code span whose name resolves to an object that docs/api.md renders becomes a
cross-reference to it; every other span stays plain code. Bare names are looked up in the
object's own module and then in ``devrng``; a class member is written with its class
(``RNGState.save``), so a parameter that shares a member's name is never linked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe

API_PAGE = Path(__file__).resolve().parent.parent / "api.md"
# ``name`` or `name`, optionally called with no arguments: ``deterministic()``.
_SPAN = re.compile(r"(?<!`)(``?)(?!`)([A-Za-z_][\w.]*)(\(\))?\1(?!`)")


class LinkCodeSpans(griffe.Extension):
    """Rewrite docstring code spans that name documented objects as autorefs links."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "devrng":
            return
        documented = dict(_documented(pkg))
        for path, obj in documented.items():
            if obj.docstring is not None:
                obj.docstring.value = _link(obj.docstring.value, path, documented)


def _documented(pkg: griffe.Module) -> Iterator[tuple[str, Any]]:
    """(public path, object) for everything docs/api.md renders with an anchor."""
    for ident in re.findall(r"^::: ([\w.]+)", API_PAGE.read_text(encoding="utf-8"), flags=re.M):
        obj = pkg[ident.removeprefix("devrng.")] if ident != "devrng" else pkg
        yield ident, obj
        if obj.is_module:  # a public module renders its exported names
            for name in obj.exports or ():
                yield from _with_members(f"{ident}.{name}", obj[str(name)])
        else:
            yield from _with_members(ident, obj, own=False)


def _with_members(path: str, obj: Any, own: bool = True) -> Iterator[tuple[str, Any]]:
    if own:
        yield path, obj
    if obj.is_class:  # members are rendered when public and documented
        for name, member in obj.members.items():
            if not name.startswith("_") and member.docstring is not None:
                yield from _with_members(f"{path}.{name}", member)


def _link(text: str, here: str, documented: dict[str, Any]) -> str:
    module = _module_of(here, documented)

    def replace(match: re.Match[str]) -> str:
        name = match[2]
        candidates = [name] if name.startswith("devrng.") else [f"{module}.{name}",
                                                                f"devrng.{name}"]
        target = next((c for c in candidates if c in documented and c != here), None)
        return match[0] if target is None else f"[{match[0]}][{target}]"

    return _SPAN.sub(replace, text)


def _module_of(path: str, documented: dict[str, Any]) -> str:
    """The public module an object is rendered under: devrng, devrng.testing, ..."""
    parts = path.split(".")
    while len(parts) > 1:
        parts.pop()
        candidate = ".".join(parts)
        if candidate == "devrng" or (candidate in documented and documented[candidate].is_module):
            return candidate
    return "devrng"

"""The devrng values of one ``torch.distributed.checkpoint.load`` call: all of them load, or none.

``dcp.load`` asks every value of the state dict for its ``state_dict()`` (the template the
checkpoint is read into), reads the checkpoint, then calls ``load_state_dict`` on the
values one by one in the order of their keys, and stops at the first that raises. Each
devrng object loads all or nothing on every rank (``load_ranked``), but on its own it
cannot undo the devrng objects loaded before it in the same call: when the portable stream
under ``"shared"`` refuses, the ``TrainingRNG`` under ``"rng"`` has already loaded. So a
devrng load made inside a ``dcp.load`` keeps its undo stack (``keep``) until the last devrng
value of that call has loaded, and a load that fails puts the earlier ones back first
(``put_back``). Its failure is agreed by every rank before it is raised, so every rank puts
back the same loads.

DCP offers no hook for this. Which ``dcp.load`` call a load belongs to is read from the
call stack: the frame of ``dcp.load`` itself, whose locals hold the sorted keys, the values
and their templates (torch 2.8 to 2.14 alike). Without that frame -- another torch, or a
load outside DCP -- a load stands alone, as ``load_ranked`` always makes it.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import CodeType
from typing import Any

from devrng._base.lazy import imported
from devrng._generators.undo import Undo

__all__ = ["Call", "current", "keep", "put_back"]

_LOADER = "torch.distributed.checkpoint.state_dict_loader"
# torch before 2.10 names the templates "statetful_sd".
_TEMPLATES = ("stateful_sd", "statetful_sd")


@dataclass(frozen=True)
class Call:
    """One ``dcp.load`` call under way."""

    keys: list[Any]  #: its sorted keys: one list object for the whole call, so it names the call
    values: Mapping[Any, Any]  #: the state dict it was given
    templates: Mapping[Any, Any]  #: what each value's ``state_dict()`` returned, filled in place

    def key_of(self, entry: Any) -> Any:
        """The key whose template ``entry`` is (``dcp.load`` passes a template, filled in
        place, to ``load_state_dict``), or None."""
        return next((k for k in self.keys if self.templates.get(k) is entry), None)

    def is_last(self, entry: Any, is_entry: Callable[[Any], bool]) -> bool:
        """Whether ``entry`` is the template of the last value ``dcp.load`` will hand a devrng
        entry (``is_entry``) to ``load_state_dict``."""
        mine = self.key_of(entry)
        members = [k for k in self.keys if _stateful(self.values.get(k))
                   and is_entry(self.templates.get(k))]
        return mine is not None and members[-1:] == [mine]


def _stateful(value: Any) -> bool:
    """Whether ``dcp.load`` calls ``value.load_state_dict`` (its ``Stateful`` test)."""
    return callable(getattr(value, "state_dict", None)) \
        and callable(getattr(value, "load_state_dict", None))


_code: list[tuple[Any, CodeType | None]] = []  # (dcp.load, its own code), looked up once


def _load_code() -> CodeType | None:
    load = getattr(imported(_LOADER), "load", None)
    if load is None:
        return None
    if not _code or _code[0][0] is not load:
        _code[:] = [(load, getattr(inspect.unwrap(load), "__code__", None))]
    return _code[0][1]


def current() -> Call | None:
    """The ``dcp.load`` call this code runs inside, or None."""
    code = _load_code()
    if code is None:
        return None
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return None
    local = frame.f_locals
    keys, values = local.get("keys"), local.get("state_dict")
    templates = next((local[n] for n in _TEMPLATES if n in local), None)
    if isinstance(keys, list) and isinstance(values, Mapping) and isinstance(templates, Mapping):
        return Call(keys, values, templates)
    return None


class _Kept(threading.local):
    """The loads made so far in the ``dcp.load`` call under way in this thread."""

    def __init__(self) -> None:
        self.keys: list[Any] | None = None
        self.loads: list[tuple[str, Undo]] = []

    def of(self, call: Call | None) -> list[tuple[str, Undo]]:
        """The kept loads of ``call``; those of any other call are dropped."""
        if call is None or self.keys is not call.keys:
            self.keys, self.loads = (None if call is None else call.keys), []
        return self.loads


_kept = _Kept()


def keep(call: Call | None, undo: Undo, entry: Any, is_entry: Callable[[Any], bool]) -> None:
    """A devrng load of ``entry`` inside ``call`` succeeded: keep ``undo`` (what it changed)
    until the last devrng value of the call has loaded."""
    loads = _kept.of(call)
    if call is None or call.is_last(entry, is_entry):
        loads.clear()  # the call loaded every devrng value: nothing is left to put back
        return
    key = call.key_of(entry)
    loads.append((repr(key) if key is not None else "a devrng value", undo))


def put_back(call: Call | None, err: BaseException) -> list[str]:
    """A devrng load inside ``call`` failed with ``err``: put back, newest first, the devrng
    values loaded before it in the same call; their keys. A failure to put one back is a
    note on ``err``, and the others are put back all the same."""
    loads = list(_kept.of(call))
    _kept.of(None)
    for name, undo in reversed(loads):
        try:
            undo.run(pending=err)
        except Exception as undo_err:
            err.add_note(f"Putting back the devrng value {name} failed: {undo_err}")
    return [name for name, _ in loads]

"""Reading flight records back, and which parts of two records of a step can be compared.

The recording side (``devrng._checks.record``) writes a JSON line per optimizer step;
this module reads those files back and finds the steps a resume must be compared with
(those the attempt that wrote the very checkpoint recorded after it), and the parts two
lines of one step both hold: all a verdict may claim it compared. The verdict itself,
what differs first and in words, is ``devrng._checks.verdict``.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from devrng._base.errors import short_repr

__all__ = ["LOADER_PREFIX", "PARTS", "compared_parts", "count_parts", "encode_line",
           "find_checkpoint", "header_of", "identity_problem", "read_lines", "read_record",
           "steps_after"]

#: Marks the fingerprint of a loader's own generator (its shuffle and worker seeds).
LOADER_PREFIX = "loader:"
Steps = dict[int, tuple[dict[str, Any], list[str]]]


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # (json.dumps makes one per call)


def encode_line(line: Mapping[str, Any]) -> str:
    """One line of a record file: the JSON text, a space and its CRC-32 (what a reader checks:
    a torn or altered line is skipped)."""
    text = _ENCODER.encode(line)
    return f"{text} {zlib.crc32(text.encode()) & 0xFFFFFFFF:08x}\n"


def read_lines(path: str) -> tuple[list[dict[str, Any]], int]:
    """Every whole, undamaged line of a record file, and how many were not."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return [], 0
    lines, damaged = [], 0
    for row in raw.split(b"\n"):
        if not row:
            continue
        text, _, crc = row.rpartition(b" ")
        try:
            if f"{zlib.crc32(text) & 0xFFFFFFFF:08x}".encode() != crc:
                raise ValueError
            line = json.loads(text)
            if not isinstance(line, dict):
                raise ValueError
        except ValueError:
            damaged += 1
            continue
        lines.append(line)
    return lines, damaged


def read_record(path: str) -> dict[str, Any]:
    """A record file as ``{"attempts": {attempt: {"id", "steps": {s: (line, names)},
    "checkpoints", "from", "end"}}, "damaged": n}`` (what ``devrng check-resume`` compares)."""
    lines, damaged = read_lines(path)
    attempts: dict[str, dict[str, Any]] = {}
    names: dict[str, list[str]] = {}
    for line in lines:
        attempt = str(line.get("a"))
        entry = attempts.setdefault(attempt, {"id": None, "steps": {}, "checkpoints": [],
                                              "from": None, "end": None})
        kind = line.get("k")
        if kind == "run":
            entry["id"] = line.get("id")
        elif kind == "names":
            names[attempt] = line.get("names", [])
        elif kind == "ckpt":
            entry["checkpoints"].append(line.get("s"))
        elif kind == "from":
            entry["from"] = (line.get("from"), line.get("s"))
        elif kind in ("stop", "end"):
            entry["end"] = (kind, line.get("s"))
        elif kind is None and isinstance(line.get("s"), int):
            entry["steps"][line["s"]] = (line, list(names.get(attempt, [])))
    return {"attempts": attempts, "damaged": damaged}


def find_checkpoint(lines: list[dict[str, Any]], key: str) -> tuple[int, str, int] | None:
    """The checkpoint line of ``key`` (its index, attempt and step): a key is drawn afresh for
    every save, so only the attempt that wrote the checkpoint has it."""
    for index, line in enumerate(lines):
        if line.get("k") == "ckpt" and line.get("key") == key and isinstance(line.get("s"), int):
            return index, str(line.get("a")), line["s"]
    return None


def header_of(lines: list[dict[str, Any]], attempt: str) -> dict[str, Any] | None:
    for line in lines:
        if line.get("k") == "run" and line.get("a") == attempt:
            return line
    return None


def steps_after(lines: list[dict[str, Any]], index: int, attempt: str) -> Steps:
    """The steps ``attempt`` recorded after line ``index``, each with the generator names
    its fingerprints are in the order of."""
    names: list[str] = []
    for line in lines[:index]:
        if line.get("k") == "names" and line.get("a") == attempt:
            names = line.get("names", [])
    steps: Steps = {}
    for line in lines[index + 1:]:
        if line.get("a") != attempt:
            continue
        if line.get("k") == "names":
            names = line.get("names", [])
        elif line.get("k") is None and isinstance(line.get("s"), int):
            steps[line["s"]] = (line, names)
    return steps


def identity_problem(saved: Any, now: Mapping[str, Any]) -> str | None:
    """Why a record of ``saved``'s description cannot be compared with this process's step by
    step (another rank or world size: each rank keeps its own record), or None. The seed is
    not compared: a checkpoint is found by the key of its save, and a resume that adopts the
    checkpoint's seed continues that very run."""
    if not isinstance(saved, Mapping):
        return "its record has no description of the run"
    differ = [f"{key} {short_repr(saved.get(key))} then, {short_repr(now.get(key))} now"
              for key in ("rank", "world_size") if saved.get(key) != now.get(key)]
    return ("it ran as another rank or world size (" + "; ".join(differ) + ")") if differ \
        else None


#: The parts of a line a comparison reads, in causal order, with their names in a verdict.
PARTS = (("g", "generators"), ("i", "batch indices"), ("b", "batch content"), ("l", "loss"),
         ("w", "parameters"))


def compared_parts(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    """The parts two lines of one step both hold (what comparing them compares), by name.

    Examples:
        >>> from devrng._checks.compare import compared_parts
        >>> compared_parts({"g": ["0a"], "w": "c1", "l": None}, {"g": ["0a"], "w": "c1"})
        ['generators', 'parameters']
    """
    return [name for key, name in PARTS
            if theirs.get(key) is not None and ours.get(key) is not None]


def count_parts(pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> dict[str, int]:
    """How many of the line pairs compared each part (see ``compared_parts``)."""
    counts: dict[str, int] = {}
    for theirs, ours in pairs:
        for name in compared_parts(theirs, ours):
            counts[name] = counts.get(name, 0) + 1
    return counts

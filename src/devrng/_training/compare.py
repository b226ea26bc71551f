"""Reading flight records and comparing their steps: what differs, in words, and what was compared.

The recording side (``devrng._training.flight``) writes a JSON line per optimizer step;
this module reads those files back, finds the steps a resume must be compared with (those
the attempt that wrote the very checkpoint recorded after it), and turns two lines of the
same step into the words of a verdict: the first part that differs, in causal order
(generators at the step's start, the batches, the loss, the parameters after the step),
or the parts both lines hold, which is all a verdict may claim it compared.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from devrng._base.errors import short_repr

__all__ = ["LOADER_PREFIX", "compared_parts", "compared_text", "encode_line", "explain",
           "find_checkpoint", "identity_problem", "read_lines", "read_record", "steps_after"]

#: Marks the fingerprint of a loader's own generator (its shuffle and worker seeds).
LOADER_PREFIX = "loader:"
Steps = dict[int, tuple[dict[str, Any], list[str]]]


def encode_line(line: Mapping[str, Any]) -> str:
    """One line of a record file: the JSON text, a space and its CRC-32 (what a reader checks:
    a torn or altered line is skipped)."""
    text = json.dumps(line, separators=(",", ":"))
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


# -- what differs, in words --------------------------------------------------------------------

_UNTRACKED = ("a generator devrng does not track (one kept on the dataset or the model, or "
              "made in the loop: rng.track(name, generator) saves and restores it)")
_HINTS = {
    "content": ("randomness inside the dataset or collate_fn that devrng does not see (draw it "
                "inside devrng.sample_rng(index), or seed it from the batch's indices), or "
                + _UNTRACKED),
    # The batch read at the model's input (HF Trainer, accelerate): the loop had it before.
    "model input": ("randomness the batch met before the model's forward pass: in the dataset "
                    "or collate_fn (draw it inside devrng.sample_rng(index)), or in the training "
                    "loop (noise added to the inputs), from " + _UNTRACKED
                    + " or from a generator the two runs left in other states"),
    "unordered": ("the loader is built with in_order=False: its workers hand over the batches "
                  "in the order they finish them, which changes from run to run, even between "
                  "two uninterrupted runs; build it with in_order=True (the default)"),
    "indices": ("the loader's sampler shuffled differently (a sampler with a generator of its "
                "own, or one a loader fast-forwards by iterating it again: build the loader "
                "with **rng.dataloader_kwargs() and use torchdata's StatefulDataLoader)"),
    "count": "another number of batches per optimizer step (gradient accumulation or the loader)",
    "computed": ("nondeterministic kernels (turn on devrng.deterministic()), model or "
                 "optimizer state the checkpoint does not hold (momentum, a gradient accumulated "
                 "inside a window, an LR scheduler, a GradScaler, a buffer), or a draw in the "
                 "step from " + _UNTRACKED),
}

#: The parts of a line a comparison reads, in causal order, with their names in a verdict.
PARTS = (("g", "generators"), ("i", "batch indices"), ("b", "batch content"), ("l", "loss"),
         ("w", "parameters"))


def _generator_hint(name: str) -> str:
    if name in ("python", "numpy"):
        return (f"something drew from the {'Python' if name == 'python' else 'NumPy'} global "
                "generator in one run and not in the other (a collate_fn, a callback, a "
                "library) or its state was not restored")
    return ("something drew from it in one run and not in the other between the checkpoint and "
            "this step, or its state was not restored")


def compared_parts(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    """The parts two lines of one step both hold (what comparing them compares), by name.

    Examples:
        >>> from devrng._training.compare import compared_parts
        >>> compared_parts({"g": ["0a"], "w": "c1", "l": None}, {"g": ["0a"], "w": "c1"})
        ['generators', 'parameters']
    """
    return [name for key, name in PARTS
            if theirs.get(key) is not None and ours.get(key) is not None]


def compared_text(counts: Mapping[str, int], steps: int) -> str:
    """What ``steps`` compared steps compared, from how many compared each part: the parts
    compared at every step, then the others with their counts, and what none compared.

    Examples:
        >>> from devrng._training.compare import compared_text
        >>> compared_text({"generators": 4, "parameters": 4, "loss": 1}, 4)
        'generators, parameters at every step; loss at 1 of 4; not batch indices, batch content'
    """
    every = [name for _, name in PARTS if counts.get(name, 0) >= steps]
    some = [f"{name} at {counts[name]} of {steps}" for _, name in PARTS
            if 0 < counts.get(name, 0) < steps]
    none = [name for _, name in PARTS if not counts.get(name)]
    text = [f"{', '.join(every)} at every step"] if every else []
    text += some
    if none:
        text.append("not " + ", ".join(none))
    return "; ".join(text)


def count_parts(pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> dict[str, int]:
    """How many of the line pairs compared each part (see ``compared_parts``)."""
    counts: dict[str, int] = {}
    for theirs, ours in pairs:
        for name in compared_parts(theirs, ours):
            counts[name] = counts.get(name, 0) + 1
    return counts


def explain(theirs: Mapping[str, Any], their_names: list[str], ours: Mapping[str, Any],
            our_names: list[str]) -> str | None:
    """Where two records of the same step differ, as the words after "at", or None.

    Examples:
        >>> from devrng._training.compare import explain
        >>> a = {"s": 7, "g": ["0a", "0b"], "n": 1, "b": "c1", "i": "d1"}
        >>> explain(a, ["cpu", "numpy"], dict(a, b="c2"), ["cpu", "numpy"])[:59]
        "step 7: the batch's indices match and its content does not:"
        >>> explain(a, ["cpu", "numpy"], dict(a, g=["0a", "0c"]), ["cpu", "numpy"])[:56]
        "step 7: at the step's start the generator numpy differed"
        >>> explain(a, ["cpu", "numpy"], a, ["cpu", "numpy"]) is None
        True
    """
    step = ours.get("s")
    where = f"step {step:,}" if isinstance(step, int) else "a step"
    position = ours.get("p")
    if isinstance(position, list) and len(position) == 2 and position[1] is not None:
        where += f" (batch {position[1] + 1} of its epoch from loader {position[0]!r})"
    theirs_g = dict(zip(their_names, theirs.get("g") or [], strict=False))
    ours_g = dict(zip(our_names, ours.get("g") or [], strict=False))
    differ = [n for n in ours_g if n in theirs_g and theirs_g[n] != ours_g[n]]
    # A loader's own generators act only through its batches, and it draws from them when it
    # prefetches (how far ahead: its workers): on their own they say nothing; beside a batch
    # that differs, they tell why.
    primary = [n for n in differ if not n.startswith(LOADER_PREFIX)]
    loaders = [n.removeprefix(LOADER_PREFIX) for n in differ if n.startswith(LOADER_PREFIX)]
    if primary:
        same = [_shown(n) for n in ours_g if n in theirs_g and n not in differ]
        return (f"{where}: at the step's start the generator{'s' if len(primary) > 1 else ''} "
                f"{', '.join(primary)} differed" + (f" ({', '.join(same)} matched)" if same else "")
                + f": {_generator_hint(primary[0])}")
    also = (f" (the loader's generator{'s' if len(loaders) > 1 else ''} {', '.join(loaders)} "
            "differed at the step's start too)") if loaders else ""
    if theirs.get("n") != ours.get("n"):
        return (f"{where}: the step consumed {ours.get('n') or 0} batch(es) here and "
                f"{theirs.get('n') or 0} in the other run{also}: {_HINTS['count']}")
    if theirs.get("b") != ours.get("b"):
        if theirs.get("u") or ours.get("u"):
            return f"{where}: the batch differs{also}: {_HINTS['unordered']}"
        content = _HINTS["model input" if ours.get("m") else "content"]
        if theirs.get("i") is not None and ours.get("i") is not None:
            if theirs["i"] == ours["i"]:
                return (f"{where}: the batch's indices match and its content does not{also}: "
                        f"{content}")
            return (f"{where}: the batch holds other samples (its indices differ){also}: "
                    f"{_HINTS['indices']}")
        return (f"{where}: the batch's content differs (its indices were not recorded){also}: "
                f"{_HINTS['indices']}, or {content}")
    for key, what in (("l", "the loss"), ("w", "the parameters after the step")):
        if theirs.get(key) is not None and ours.get(key) is not None and theirs[key] != ours[key]:
            return (f"{where}: the batch and every generator matched and {what} did not: "
                    f"{_HINTS['computed']}")
    return None


def _shown(name: str) -> str:
    return name.removeprefix(LOADER_PREFIX)

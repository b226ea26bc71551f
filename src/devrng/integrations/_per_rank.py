"""One object holding every rank's TrainingRNG state, for trainers that checkpoint from rank 0.

Lightning and accelerate write a callback's or a registered object's state from the
main process only; every rank's generators differ, so the state gathers all of them
(a collective: every rank must call ``state_dict()``, as these trainers do) and each
rank takes its own back. The entry a trainer writes -- those states and what the
integration adds (loader descriptions, a place in the epoch) -- is sealed whole
(``seal_entry``) and checked whole before any of it is used (``check_entry``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from devrng._base.errors import DevRNGError, short_repr
from devrng._base.rank import dist_or_none, group_size, process_rank
from devrng._generators.ranks.protocol import nested_state
from devrng._generators.saved import SEAL_KEYS, SavedForm, check_saved, refusing, seal
from devrng._training.training_rng import TrainingRNG, load_training_state

__all__ = ["PerRankState", "check_entry", "gather", "seal_entry"]


def gather(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (a collective: every rank calls it)."""
    size = group_size()
    if size == 1:
        return [obj]
    out: list[Any] = [None] * size
    dist_or_none().all_gather_object(out, obj)
    return out


def seal_entry(form: SavedForm, parts: Mapping[str, Any]) -> dict[str, Any]:
    """A trainer's entry of ``form``: ``parts`` (``PerRankState.state_dict()``'s, and what
    the integration adds) with a header, sealed (``seal``)."""
    return seal({"format": form.tag, "version": form.version, **parts})


def check_entry(state: Any, form: SavedForm, keys: frozenset[str],
                optional: frozenset[str] = frozenset(), *, unsealed: bool = True,
                source: str | None = None) -> None:
    """Raise ``DevRNGError`` unless ``state`` is a trainer's entry of ``form`` as devrng wrote
    it (``keys``, and any of ``optional``): sealed and intact (``check_saved``: a key or value
    changed anywhere is refused), or (``unsealed``) the unsealed entry of devrng 0.4.0, whose
    keys were those alone (read unchecked, as other forms' unsealed versions). ``source``
    names where ``state`` was read from, for the messages.

    Examples:
        >>> form = SavedForm("devrng.Example", (1,), 1, "Example", "Example.state_dict()")
        >>> check_entry(seal_entry(form, {"ranks": []}), form, frozenset({"ranks"}))
    """
    if unsealed and isinstance(state, Mapping) and set(state) <= keys | optional:
        return
    with refusing(form.what):
        check_saved(state, form, source=source)
        expected = keys | {"format", "version"} | SEAL_KEYS
        if set(state) - optional != expected:
            raise DevRNGError(f"{form.what}: {source or 'the state'} has the keys "
                              f"{short_repr(sorted(map(str, state)))}; devrng writes "
                              f"{', '.join(sorted(expected | optional))}.")


class PerRankState:
    """``state_dict()`` / ``load_state_dict()`` over every rank's ``TrainingRNG`` state.

    Examples:
        >>> state = PerRankState(devrng.TrainingRNG(seed=1))
        >>> saved = state.state_dict()
        >>> len(saved["ranks"])
        1
        >>> state.load_state_dict(saved)
    """

    def __init__(self, rng: TrainingRNG, *, strict: bool = True, owner: str = "devrng",
                 lenient: str = "strict=False") -> None:
        self.rng = rng
        self.strict = strict
        self.owner = owner
        self.lenient = lenient  # how the user passes strict=False to the owner

    def state_dict(self) -> dict[str, Any]:
        # Each rank's plain state (not its DCP entry): one per rank in the list, in one file,
        # so without a save identity (and without counting a save in the job's store).
        return {"ranks": gather(nested_state(self.rng))}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ranks = state_dict.get("ranks") if isinstance(state_dict, dict) else None
        if not isinstance(ranks, list) or not ranks:
            got = (f"a dict with the keys {', '.join(sorted(map(short_repr, state_dict)))}"
                   if isinstance(state_dict, dict) else f"a {type(state_dict).__name__}")
            raise DevRNGError(
                f"{self.owner}: the checkpoint holds no devrng RNG state (its entry is {got}, "
                "not {'ranks': [one state per rank]}); it was saved without devrng, or by "
                "another program."
            )
        rank = process_rank()
        if rank < len(ranks):
            load_training_state(self.rng, ranks[rank], strict=self.strict, lenient=self.lenient)
        elif self.strict:
            raise DevRNGError(
                f"{self.owner}: the checkpoint holds the RNG of {len(ranks)} rank(s), and this is "
                f"rank {rank}; pass {self.lenient} to resume on more ranks (the new ranks' "
                "generators are then seeded from the seed and their rank)."
            )
        else:  # another rank's state: TrainingRNG derives this rank's own streams
            load_training_state(self.rng, ranks[0], strict=False)

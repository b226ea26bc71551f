"""One object holding every rank's TrainingRNG state, for trainers that checkpoint from rank 0.

Lightning and accelerate write a callback's or a registered object's state from the
main process only; every rank's generators differ, so the state gathers all of them
(a collective: every rank must call ``state_dict()``, as these trainers do) and each
rank takes its own back.
"""

from __future__ import annotations

from typing import Any

from devrng._base.errors import DevRNGError, short_repr
from devrng._base.rank import dist_or_none, group_size, process_rank
from devrng._generators.ranks.protocol import nested_state
from devrng._training.training_rng import TrainingRNG, load_training_state

__all__ = ["PerRankState", "gather"]


def gather(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (a collective: every rank calls it)."""
    size = group_size()
    if size == 1:
        return [obj]
    out: list[Any] = [None] * size
    dist_or_none().all_gather_object(out, obj)
    return out


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

"""A DCP load planner that lets a job with more ranks than the saved one load devrng's state.

DCP's ``DefaultLoadPlanner`` plans a load from the template the state dict holds
at load time, before it reads anything, and fails on every rank for a template
key the checkpoint does not have. A job with more ranks than the one that saved
asks for entries (``devrng_rank_<r>``) that no saved rank wrote, so with the
default planner it fails inside DCP ("Missing key in checkpoint state_dict").
This planner is the default one, except that such a devrng entry is left out of
the plan and marked as not found; devrng's ``load_state_dict`` then decides on
every rank together: continue exactly (streams every saved rank held alike),
seed afresh with a warning (``TrainingRNG(strict=False)``), or refuse.

Imported only when ``devrng.distributed.load_planner`` is called:
``torch.distributed.checkpoint`` takes about a second to import.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import LoadPlan

from devrng._generators.ranks.protocol import entry_rank

__all__ = ["Planner"]


class Planner(DefaultLoadPlanner):
    """DCP's default load planner, except that a devrng entry missing from the checkpoint
    is marked as not found (``None``) instead of failing the load inside DCP, and a key an
    entry gained since (a portable stream's header, devrng 0.5) is left out of the entry
    when the checkpoint's entry lacks it, so that the older entry loads as what it is;
    made by ``devrng.distributed.load_planner``."""

    def create_local_plan(self) -> LoadPlan:
        saved = self.metadata.state_dict_metadata if self.metadata is not None else {}
        paths: dict[str, tuple[Any, ...]] = {k: self.mappings.get(k, (k,)) for k in self.state_dict}
        for fqn in [k for k in self.state_dict if k not in saved]:
            path = paths[fqn]
            at = next((i for i, part in enumerate(path)
                       if entry_rank(part) is not None), None)
            if at is None:
                continue
            del self.state_dict[fqn]
            entry = path[:at + 1]
            if len(path) > len(entry) and any(k in saved and p[:at + 1] == entry
                                              for k, p in paths.items()):
                parent = self.original_state_dict  # the entry was saved: this key is newer
                for part in path[:-1]:
                    parent = parent[part]
                del parent[path[-1]]
            else:
                set_element(self.original_state_dict, path, None)  # "not found"
        return super().create_local_plan()  # type: ignore[no-any-return]

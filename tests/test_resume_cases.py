"""The cases of issue 37 in a plain loop: a ``TrainingRNG`` with torchdata's
``StatefulDataLoader`` (2 workers), saved after batch 3 and resumed in a new process, is
bitwise the uninterrupted run, or warns with a ``DevRNGWarning`` that names the cause, or
refuses to resume with a ``DevRNGError`` sentence (API.md §10, "exact, or said").

``tests/_loop_run.py`` runs the programs: one process runs the uninterrupted runs (A), which
save after step 3 (and after each epoch's loop); another the resumes (B). Every run is a
process of its own, forked from one that has only imported torch and devrng. Each of
devrng's fixes has a control with the fix turned off (``tests/_internals.py``'s ``FIXES``):
the case then goes wrong without a word, so the exact and warned cells depend on the fix.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.integrations._runs import Result, check_flight, check_resumed, is_exact, run, target

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("torchdata") is None,
                                 reason="needs torchdata (the core environment has it)")]
PROGRAM = "tests._loop_run"


@dataclass(frozen=True)
class Cell:
    name: str  # the configuration, in the program's CONFIGS
    checkpoint: str
    expect: str  # "exact", "warned", "refused", or "silent" (differs, and only the flight record says so)
    match: str = ""
    changes: dict[str, Any] = field(default_factory=dict)  # at resume
    flagged: str = ""  # "silent": what the flight record says, alone

    @property
    def tag(self) -> str:
        return "B-" + self.checkpoint + "".join(f"-{k}{v}" for k, v in self.changes.items())

    def __str__(self) -> str:
        return f"{self.name}-{self.tag[2:]}-{self.expect}"


DRAWS = (r"the checkpoint was written inside an epoch, and the resumed loader starts new "
         r"workers, whose torch, Python and NumPy generators start afresh: the workers of the "
         r"loader 'loader' drew random numbers outside devrng.sample_rng \(in the dataset or in "
         r"its collate_fn\) before the checkpoint")
# What the flight record says of a batch drawn afresh by the resumed loader's new workers.
CONTENT = (r"at step 4 \(batch 4 of its epoch from loader 'loader'\): the batch's indices match "
           r"and its content does not: randomness inside the dataset or collate_fn")
CELLS = [
    # 1. augmentation: inside sample_rng (exact), none at all (exact: no false alarm), drawn
    # from the workers' own generators (warned), in workers devrng does not seed (warned: it
    # cannot tell, and says so)
    Cell("stateful", "step3.pt", "exact"),
    Cell("stateful-none", "step3.pt", "exact"),
    Cell("stateful-outside", "step3.pt", "warned", DRAWS),
    Cell("stateful-outside", "step3.pt", "silent", changes={"fix_off": ["WORKER_DRAWS"]},
         flagged=CONTENT),
    # (devrng cannot tell at load: the flight record, on in these runs, says so alone)
    Cell("stateful-unseeded", "step3.pt", "silent", flagged=CONTENT),
    # issue 44: no load-time warning on an exact resume. Workers kept across epochs
    # (persistent_workers, pin_memory): exact inside their first epoch and at an epoch's end;
    # inside a later one devrng cannot tell at load, and the record says so alone
    Cell("stateful-persistent", "step3.pt", "exact"),
    Cell("stateful-persistent", "epoch1.pt", "exact"),
    Cell("stateful-persistent", "step10.pt", "silent",
         flagged=r"at step 11 \(batch 4 of its epoch from loader 'loader'\): the batch's indices "
                 r"match and its content does not"),
    # a sharded IterableDataset whose workers shuffle with torch.randperm and augment from their
    # own generators: torchdata fast-forwards them from the epoch's start, so the draws repeat
    Cell("stateful-iterable", "step3.pt", "exact"),
    Cell("stateful-iterable", "step10.pt", "exact"),
    # 2. samplers torchdata replays: exact in epoch 0 and 1, beyond a chunk of 32 draws
    Cell("stateful-subset", "step3.pt", "exact"),
    Cell("stateful-subset", "step10.pt", "exact"),
    Cell("stateful-subset", "step10.pt", "silent", changes={"fix_off": ["REPLAYED_SAMPLERS"]},
         flagged=r"at step 11 \(batch 5 of its epoch from loader 'loader'\): the batch holds "
                 r"other samples \(its indices differ\).*the loader's sampler shuffled "
                 r"differently"),
    Cell("stateful-weighted", "step3.pt", "exact"),
    Cell("stateful-replacement", "step5.pt", "exact"),
    # 3. a collate_fn drawing from NumPy: in workers (warned), in the main process (exact)
    Cell("stateful-collate", "step3.pt", "warned", DRAWS),
    Cell("stateful-collate", "step3.pt", "silent", changes={"fix_off": ["WORKER_DRAWS"]},
         flagged=CONTENT),
    Cell("stateful-collate-main", "step3.pt", "exact"),
    # 5. another number of workers: inside an epoch (exact: the place is rewritten; 0 workers
    # keep it in another form: refused in a sentence), and at an epoch's end (exact)
    Cell("stateful", "step3.pt", "exact", changes={"workers": 3}),
    Cell("stateful", "epoch1.pt", "exact", changes={"workers": 3}),
    Cell("stateful", "step3.pt", "refused", r"TrainingRNG.load_state_dict: the loader 'loader' was "
         r"saved inside an epoch \(after batch 3\) with num_workers=2 and has num_workers=0; "
         r"torchdata's StatefulDataLoader restores a place in an epoch only with the number of "
         r"workers that saved it.*resume with num_workers=2", changes={"workers": 0}),
    Cell("stateful", "step3.pt", "refused", r"AssertionError: $",  # torchdata's, as it was
         changes={"workers": 3, "fix_off": ["WORKER_COUNT"]}),
    Cell("stateful-outside", "step3.pt", "warned", r"had num_workers=2 and has 3: each worker "
         r"draws.*" + DRAWS, changes={"workers": 3}),
]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cases")
    run(PROGRAM, folder, [{"mode": "A", "name": name}
                          for name in dict.fromkeys(c.name for c in CELLS)])
    run(PROGRAM, folder, [{"mode": "B", "name": c.name, "tag": c.tag, "changes": c.changes,
                           "checkpoint": str(folder / c.name / "ck" / c.checkpoint)}
                          for c in CELLS])
    return folder


@pytest.mark.parametrize("cell", CELLS, ids=str)
def test_cell(out: Path, cell: Cell) -> None:
    whole = Result.read(out / cell.name / "A.json")
    resumed = Result.read(target(out, {"mode": "B", "name": cell.name, "tag": cell.tag}))
    if cell.expect == "silent":  # the fix turned off: wrong, and only the flight record says so
        assert not is_exact(whole, resumed)
        check_flight("silent", resumed, cell.flagged)
        return
    if cell.expect != "refused":
        assert resumed.losses, "the resumed run trained no step"
    check_resumed(whole, resumed, cell.expect, cell.match)
    check_flight(cell.expect, resumed)


def test_the_checkpoint_sits_where_the_cells_say(out: Path) -> None:
    """The uninterrupted runs trained the steps the cells resume from: 7 an epoch (26 samples,
    batch 4), 10 with a replayed RandomSampler of 40 draws; step 10 is in epoch 1."""
    assert Result.read(out / "stateful" / "A.json").steps == 21
    assert Result.read(out / "stateful-replacement" / "A.json").steps == 30
    subset = Result.read(out / "stateful-subset" / "A.json")
    assert len(subset.order) == 3 and len(subset.order[0].split(",")) == 24

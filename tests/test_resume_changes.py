"""A plain training loop resumed after users changed the loader between runs, and with workers
kept across epochs (issue 31): exact, or a DevRNGWarning naming the old and new value and how
to resume exactly (API.md §10, "never silent").

``tests/_loop_run.py`` is the program docs/resume.md shows. One process runs the
uninterrupted runs (A), which save after each epoch's loop; another the resumes (B), each
from A's checkpoint after epoch 1, with a change. Every run is a process of its own, forked
from one that has only imported torch and devrng (tests/integrations/_runs.py). The
unchanged resume is exact: the changes alone make the resumed runs differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.integrations._runs import Result, check_resumed, run, target

pytestmark = pytest.mark.slow
PROGRAM = "tests._loop_run"


@dataclass(frozen=True)
class Cell:
    name: str  # the configuration, in the program's CONFIGS
    expect: str  # "exact" or "warned"
    match: str = ""
    changes: dict[str, Any] = field(default_factory=dict)  # at resume
    checkpoint: str = "epoch1.pt"

    @property
    def tag(self) -> str:
        return "B-" + self.checkpoint + "".join(f"-{k}{v}" for k, v in self.changes.items())

    def __str__(self) -> str:
        return f"{self.name}-{self.tag[2:]}-{self.expect}"


CELLS = [
    Cell("loader", "exact"),
    Cell("weighted", "exact"),  # a WeightedRandomSampler, with replacement
    # 1. shuffle=True -> False: a SequentialSampler instead of the RandomSampler
    Cell("loader", "warned", r"the loader 'loader' drew its indices from a RandomSampler "
         r"\(shuffle=True\) and now from a SequentialSampler \(shuffle=False\).*resume with "
         r"shuffle=True", changes={"shuffle": False}),
    # 2. the dataset grew (26 -> 30 samples): other indices, another number of batches
    Cell("loader", "warned", r"the dataset of the loader 'loader' had 26 samples and has 30.*"
         r"resume with the dataset of 26 samples", changes={"size": 30}),
    # 3. drop_last False -> True: 26 % 4 leaves an incomplete last batch, now dropped
    Cell("loader", "warned", r"the loader 'loader' had drop_last=False and has drop_last=True.*"
         r"resume with drop_last=False", changes={"drop_last": True}),
    # 6. kept workers: the uninterrupted run's go on, a resumed run starts new ones, which
    # draw the base seed before the shuffle: the order differs too (issue 37)
    Cell("persistent", "warned", r"the loader 'loader' keeps its workers from epoch to epoch.*"
         r"so the order of the samples differs \(a new iterator draws the base seed from the "
         r"loader's generator before the epoch's shuffle, kept workers do not\), and so does "
         r"their augmentation"),
    Cell("persistent", "warned", r"keeps its workers from epoch to epoch.*so the samples' "
         r"augmentation differs; ", changes={"fix_off": ["PERSISTENT_ORDER"]}),
]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("loop")
    run(PROGRAM, folder, [{"mode": "A", "name": name} for name in
                          ("loader", "weighted", "persistent", "persistent-untracked",
                           "persistent-alone")])
    run(PROGRAM, folder, [{"mode": "B", "name": c.name, "tag": c.tag, "changes": c.changes,
                           "checkpoint": str(folder / c.name / "ck" / c.checkpoint)}
                          for c in CELLS])
    return folder


@pytest.mark.parametrize("cell", CELLS, ids=str)
def test_cell(out: Path, cell: Cell) -> None:
    whole = Result.read(out / cell.name / "A.json")
    resumed = Result.read(target(out, {"mode": "B", "name": cell.name, "tag": cell.tag}))
    assert resumed.losses, "the resumed run trained no step"
    check_resumed(whole, resumed, cell.expect, cell.match)


@pytest.mark.parametrize(("name", "same"), [("loader", True), ("persistent", False)])
def test_the_resumed_epochs_order_is_the_uninterrupted_ones_unless_workers_are_kept(
        out: Path, name: str, same: bool) -> None:
    """The order of the samples of epoch 1 after a resume from the end of epoch 0: the
    uninterrupted run's -- unless its workers were kept, as the warning says."""
    whole = Result.read(out / name / "A.json")
    resumed = Result.read(target(out, {"mode": "B", "name": name, "tag": "B-epoch1.pt"}))
    assert len(whole.order) == 3 and len(resumed.order) == 2
    assert (resumed.order[0] == whole.order[1]) is same
    assert sorted(resumed.order[0].split(",")) == sorted(whole.order[1].split(","))


@pytest.mark.parametrize(("name", "anew"), [("persistent", True),
                                            ("persistent-untracked", True),
                                            ("persistent-alone", False)])
def test_kept_workers_augment_anew_each_epoch_where_devrng_seeds_them(out: Path, name: str,
                                                                     anew: bool) -> None:
    """Workers kept across epochs keep the base seed of the epoch that started them, and
    sample_rng seeds each sample from it: devrng's seeding gives each later epoch a seed of its
    own, tracked or not; a loader seeded without devrng (the control) repeats every sample's
    augmentation, epoch after epoch."""
    samples = Result.read(out / name / "A.json").samples
    assert len(samples) == 3
    if anew:
        assert len(set(samples)) == 3, samples
    else:
        assert len(set(samples)) == 1, samples


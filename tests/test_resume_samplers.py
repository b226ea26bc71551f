"""Samplers that decide a resumed epoch's order outside torchdata's saved place (issue 44,
section 6), in a plain loop: a ``TrainingRNG`` with torchdata's ``StatefulDataLoader``, saved
inside epoch 1 and resumed in a new process, is bitwise the uninterrupted run.

- a ``DistributedSampler`` whose epoch the loop sets (``set_epoch``) before each epoch's loop,
  after ``load_state_dict``: the resumed iterator is made when the loop asks for it, with the
  epoch the loop set;
- a ``batch_sampler`` of the user's that shuffles with a (tracked) generator of its own;
- a sampler of the user's that shuffles with Python's ``random`` or torch's global
  ``randperm`` when ``iter`` is called -- which torchdata calls more than once as it makes a
  resumed iterator.

Each with 2 workers and without (``-main``). ``tests/_loop_run.py`` runs the programs, as for
``tests/test_resume_cases.py``. Each fix has a control with it turned off
(``tests/_internals.py``'s ``FIXES``): the resume then differs and only the flight record says
so -- as every one of these cases did before the fixes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tests.integrations._runs import Result, check_flight, check_resumed, is_exact, run, target

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("torchdata") is None,
                                 reason="needs torchdata (the core environment has it)")]
PROGRAM = "tests._loop_run"
# (configuration, checkpoint, fix turned off or None): inside epoch 1, after batch 2 of 4
# (the DistributedSampler's 13 samples of 26) or after batch 3 of 7.
# The user's batch sampler with 2 workers resumed exactly before the fix too (torchdata draws
# its order as it makes the iterator): no control.
CELLS = [
    *[(f"stateful-distributed{main}", "step6.pt", fix)
      for main in ("", "-main") for fix in (None, "LATE_RESUME")],
    ("stateful-batches", "step10.pt", None),
    *[(f"stateful-{kind}{main}", "step10.pt", fix)
      for kind, main in (("batches", "-main"), ("python", ""), ("python", "-main"),
                         ("randperm", ""), ("randperm", "-main"))
      for fix in (None, "SAMPLER_DRAWS")],
]


def _tag(checkpoint: str, fix: str | None) -> str:
    return f"B-{checkpoint}" + (f"-off{fix}" if fix else "")


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("samplers")
    run(PROGRAM, folder, [{"mode": "A", "name": name}
                          for name in dict.fromkeys(name for name, _, _ in CELLS)])
    run(PROGRAM, folder, [{"mode": "B", "name": name, "tag": _tag(ck, fix),
                           "changes": {"fix_off": [fix]} if fix else {},
                           "checkpoint": str(folder / name / "ck" / ck)}
                          for name, ck, fix in CELLS])
    return folder


@pytest.mark.parametrize(("name", "checkpoint", "fix"), CELLS,
                         ids=[f"{n}-{c[:-3]}" + (f"-{f}-off" if f else "") for n, c, f in CELLS])
def test_resumed_inside_epoch_1(out: Path, name: str, checkpoint: str, fix: str | None) -> None:
    whole = Result.read(out / name / "A.json")
    resumed = Result.read(target(out, {"mode": "B", "name": name, "tag": _tag(checkpoint, fix)}))
    assert resumed.losses, "the resumed run trained no step"
    if fix is None:
        check_resumed(whole, resumed, "exact")
        check_flight("exact", resumed)
        return
    # The fix turned off: the resumed epoch yields other samples, and only the record says
    # so, at the first step after the checkpoint.
    first = int(checkpoint[4:-3]) + 1
    assert not is_exact(whole, resumed)
    check_flight("silent", resumed, rf"at step {first} \(batch \d+ of its epoch from loader "
                                    r"'loader'\): the batch holds other samples")


def test_the_checkpoints_sit_inside_epoch_1(out: Path) -> None:
    """A DistributedSampler of rank 0 of 2 gives 13 of the 26 samples (4 batches an epoch),
    the others all 26 (7): step 6 and step 10 are inside epoch 1, and every epoch holds every
    sample once, in another order each epoch."""
    for name, per_epoch in (("stateful-distributed", 13), ("stateful-batches-main", 26),
                            ("stateful-python", 26), ("stateful-randperm-main", 26)):
        whole = Result.read(out / name / "A.json")
        assert whole.steps == 3 * -(-per_epoch // 4)
        orders = [list(map(int, o.split(","))) for o in whole.order]
        assert all(len(set(o)) == len(o) == per_epoch for o in orders)
        assert len(set(map(tuple, orders))) == 3

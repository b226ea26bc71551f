"""devrng.integrations.lightning's seeding and checkpoint state with the real Lightning.

Resumes in new processes -- every loader, cadence and change at resume -- are in
tests/integrations/test_resume_matrix.py.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from devrng.integrations.lightning import DevRNGCallback  # noqa: E402


def test_the_callback_seeds_when_created_as_seed_everything_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    pl.seed_everything(321, verbose=False)
    theirs = (torch.rand(3), random.random(), np.random.random())
    callback = DevRNGCallback(321)  # before the model is built, so its weights are seeded
    callback.setup(None, None, "fit")  # type: ignore[arg-type]  # the same process: no reseed
    ours = (torch.rand(3), random.random(), np.random.random())
    assert torch.equal(theirs[0], ours[0]) and theirs[1:] == ours[1:]
    import os

    assert os.environ["PL_GLOBAL_SEED"] == "321" and os.environ["PL_SEED_WORKERS"] == "1"


def test_the_callback_honours_pl_global_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEVRNG_SEED", raising=False)
    monkeypatch.setenv("PL_GLOBAL_SEED", "77")
    assert DevRNGCallback().rng.seed == 77  # callback.rng exists from the start


def test_a_checkpoint_from_fewer_ranks_is_refused_unless_lenient(
        monkeypatch: pytest.MonkeyPatch) -> None:
    callback = DevRNGCallback(5)
    state = callback.state_dict()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(devrng_error(), match="holds the RNG of 1 rank"):
        callback.load_state_dict(state)
    lenient = DevRNGCallback(5, strict=False)
    with pytest.warns(devrng_warning()) as caught:
        lenient.load_state_dict(state)
    messages = [str(w.message) for w in caught]
    assert any("did not restore: the global generators of rank 0" in m for m in messages)
    assert any("written by a run of 1 process(es) and this run has 2" in m for m in messages)


def devrng_error() -> type[Exception]:
    import devrng

    return devrng.DevRNGError


def devrng_warning() -> type[Warning]:
    import devrng

    return devrng.DevRNGWarning

"""devrng.integrations.lightning with the real Lightning (the integrations environment).

The measurement behind it: a small LightningModule (dropout 0.3, a shuffled DataLoader
with 2 workers whose dataset draws augmentation from torch, NumPy and Python),
two epochs in one process vs one epoch, ``trainer.save_checkpoint``, and
``fit(ckpt_path=...)`` in a new process.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from tests.integrations._runs import whole_and_resumed  # noqa: E402

from devrng.integrations.lightning import DevRNGCallback  # noqa: E402

PROGRAM = "tests.integrations._lightning_run"
pytestmark = pytest.mark.slow


def test_plain_lightning_resumes_the_first_epoch_but_not_the_second(tmp_path: Path) -> None:
    whole, first, resumed = whole_and_resumed(PROGRAM, "plain", 2, tmp_path)
    assert whole[:len(first)] == first
    assert whole[len(first):] != resumed  # seed_everything alone: the resumed epoch drifts


def test_with_the_callback_the_resumed_epoch_is_bitwise_the_same(tmp_path: Path) -> None:
    whole, first, resumed = whole_and_resumed(PROGRAM, "devrng", 2, tmp_path)
    assert whole[:len(first)] == first
    assert whole[len(first):] == resumed


def test_without_its_checkpoint_state_the_callback_would_not_resume(tmp_path: Path) -> None:
    whole, first, resumed = whole_and_resumed(PROGRAM, "devrng-without-state", 2, tmp_path)
    assert whole[len(first):] != resumed


def test_setup_draws_what_seed_everything_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    pl.seed_everything(321, verbose=False)
    theirs = (torch.rand(3), random.random(), np.random.random())
    callback = DevRNGCallback(321)
    callback.setup(None, None, "fit")  # type: ignore[arg-type]
    ours = (torch.rand(3), random.random(), np.random.random())
    assert torch.equal(theirs[0], ours[0]) and theirs[1:] == ours[1:]
    import os

    assert os.environ["PL_GLOBAL_SEED"] == "321" and os.environ["PL_SEED_WORKERS"] == "1"


def test_the_callback_honours_pl_global_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEVRNG_SEED", raising=False)
    monkeypatch.setenv("PL_GLOBAL_SEED", "77")
    callback = DevRNGCallback()
    callback.setup(None, None, "fit")  # type: ignore[arg-type]
    assert callback.rng is not None and callback.rng.seed == 77


def test_a_checkpoint_from_fewer_ranks_is_refused_unless_lenient(
        monkeypatch: pytest.MonkeyPatch) -> None:
    callback = DevRNGCallback(5)
    callback.setup(None, None, "fit")  # type: ignore[arg-type]
    state = callback.state_dict()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(devrng_error(), match="holds the RNG of 1 rank"):
        callback.load_state_dict(state)
    lenient = DevRNGCallback(5, strict=False)
    lenient.setup(None, None, "fit")  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match="the global generators of rank 0"):
        lenient.load_state_dict(state)


def devrng_error() -> type[Exception]:
    import devrng

    return devrng.DevRNGError


@pytest.mark.parametrize(("mode", "exact"), [("plain-stateful", False), ("devrng-stateful", True)])
def test_a_mid_epoch_checkpoint_with_a_stateful_dataloader(tmp_path: Path, mode: str,
                                                           exact: bool) -> None:
    """torchdata's StatefulDataLoader (samples drawn in devrng.sample_rng), a ModelCheckpoint
    after step 11 of 24 (the middle of the second epoch), fit(ckpt_path=...) from it."""
    pytest.importorskip("torchdata")
    from tests.integrations._runs import losses, run

    run(PROGRAM, mode, "3", str(tmp_path / "whole.json"))
    run(PROGRAM, mode, "3", str(tmp_path / "first.json"), "--save", str(tmp_path / "mid.ckpt"),
        "--max-steps", "11")
    run(PROGRAM, mode, "3", str(tmp_path / "resumed.json"), "--resume", str(tmp_path / "mid.ckpt"))
    whole, resumed = losses(tmp_path / "whole.json"), losses(tmp_path / "resumed.json")
    assert len(resumed) == 13
    assert (whole[11:] == resumed) is exact

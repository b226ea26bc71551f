"""Mistakes users make, each answered with a sentence that says what to do (issue 47)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import devrng


def test_a_training_rngs_state_given_to_set_rng_state_names_load_state_dict() -> None:
    rng = devrng.TrainingRNG(seed=1)
    with pytest.raises(TypeError, match=r"the state_dict\(\) of a TrainingRNG .*put it back with "
                                        r"that object's load_state_dict\(state\), e\.g\. "
                                        r"rng\.load_state_dict\(state\)"):
        devrng.set_rng_state(rng.state_dict())
    with pytest.raises(TypeError, match=r"RNGState\.from_dict\(state\)"):
        devrng.set_rng_state(devrng.get_rng_state().to_dict())


def test_a_whole_checkpoint_given_to_load_state_dict_names_the_key_that_holds_the_state(
        ) -> None:
    rng = devrng.TrainingRNG(seed=1)
    checkpoint = {"model": {"w": torch.ones(2)}, "step": 3, "rng": rng.state_dict()}
    before = devrng.get_rng_state()
    with pytest.raises(devrng.DevRNGError, match=r"holds a devrng state under the key 'rng' "
                                                 r"\(a whole checkpoint\?\): pass that entry, "
                                                 r"checkpoint\['rng'\]"):
        rng.load_state_dict(checkpoint)
    assert devrng.get_rng_state() == before
    rng.load_state_dict(checkpoint["rng"])  # what the sentence says works
    with pytest.raises(devrng.DevRNGError, match=r"a dict with the keys 'model', 'step', none of "
                                                 r"which holds a devrng state\.$"):
        rng.load_state_dict({"model": {}, "step": 3})
    snapshot = {"rng": devrng.get_rng_state().to_dict()}
    with pytest.raises(devrng.DevRNGError, match=r"checkpoint\['rng'\]"):
        devrng.RNGState.from_dict(snapshot)


@pytest.mark.parametrize("path", ["ckpt.pt", Path("ckpt.pt")], ids=["str", "Path"])
def test_a_path_given_to_load_state_dict_says_to_load_the_file_first(path: object) -> None:
    rng = devrng.TrainingRNG(seed=1)
    with pytest.raises(devrng.DevRNGError, match=r"ckpt\.pt'\), not a state: to resume from a "
                                                 r"file, load it first \(torch\.load\(path, "
                                                 r"weights_only=True\)\)|'ckpt\.pt', not a "
                                                 r"state: to resume from a file, load it first"):
        rng.load_state_dict(path)  # type: ignore[arg-type]

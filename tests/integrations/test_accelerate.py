"""devrng.integrations.accelerate with a real Accelerator on the CPU (the integrations env).

Each case: two epochs in one process vs one epoch, ``accelerator.save_state``, and
``load_state`` + the second epoch in a new process; a shuffled DataLoader with two
workers drawing augmentation from torch, NumPy and Python, and dropout.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
if importlib.util.find_spec("torch_xla") is not None:
    # With torch_xla installed accelerate moves to XLA even with cpu=True, and its own
    # save_state fails there ('MpDeviceLoaderWrapper' object has no attribute 'dataset'):
    # these tests run in the integrations environment, which has no torch_xla.
    pytest.skip("accelerate picks XLA where torch_xla is installed (integrations env runs "
                "these)", allow_module_level=True)

from tests.integrations._runs import whole_and_resumed

PROGRAM = "tests.integrations._accelerate_run"
pytestmark = pytest.mark.slow


def test_accelerates_own_states_resume_a_plain_loop_at_an_epoch_boundary(tmp_path: Path) -> None:
    whole, first, resumed = whole_and_resumed(PROGRAM, "plain", 2, tmp_path)
    assert whole[len(first):] == resumed  # measured: python, numpy, torch CPU are enough here


def test_accelerate_misses_a_seeded_jit_stream(tmp_path: Path) -> None:
    whole, first, resumed = whole_and_resumed(PROGRAM, "plain-seeded-jit", 2, tmp_path)
    assert whole[len(first):] != resumed


def test_registered_training_rng_resumes_bitwise(tmp_path: Path) -> None:
    whole, first, resumed = whole_and_resumed(PROGRAM, "devrng", 2, tmp_path)
    assert whole[:len(first)] == first
    assert whole[len(first):] == resumed


def test_without_registering_devrngs_state_is_lost(tmp_path: Path) -> None:
    whole, first, resumed = whole_and_resumed(PROGRAM, "devrng-without-state", 2, tmp_path)
    assert whole[len(first):] != resumed  # accelerate does not save the loader's generator

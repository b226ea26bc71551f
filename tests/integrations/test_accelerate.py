"""devrng.integrations.accelerate with a real Accelerator on the CPU, in this process.

Resumes in new processes -- epoch ends, inside an epoch, changes at resume -- are in
tests/integrations/test_resume_matrix.py; here: what the registered state records and
that loading it warns (``pytest.warns`` and the ``"devrng"`` logger) when it must.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import pytest
import torch
from tests._helpers import resealed

pytest.importorskip("accelerate")
if importlib.util.find_spec("torch_xla") is not None:
    # With torch_xla installed accelerate moves to XLA even with cpu=True, and its own
    # save_state fails there ('MpDeviceLoaderWrapper' object has no attribute 'dataset'):
    # these tests run in the integrations environment, which has no torch_xla.
    pytest.skip("accelerate picks XLA where torch_xla is installed (integrations env runs "
                "these)", allow_module_level=True)

import accelerate

import devrng
from devrng.integrations.accelerate import register


@pytest.fixture(autouse=True)
def _in_a_folder_of_its_own(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An Accelerator without a project_dir keeps the flight record (on by default) in the
    current directory: each test's own, not the checkout."""
    monkeypatch.chdir(tmp_path)


def _registered(accelerator: accelerate.Accelerator) -> Any:
    [registered] = [obj for obj in accelerator._custom_objects if hasattr(obj, "rng")]
    return registered


def test_a_state_saved_inside_an_epochs_loop_warns_when_loaded(
        caplog: pytest.LogCaptureFixture) -> None:
    accelerator = accelerate.Accelerator(cpu=True)
    rng = register(accelerator, seed=3)
    loader = accelerator.prepare(torch.utils.data.DataLoader(range(8), batch_size=2, shuffle=True,
                                                             **rng.dataloader_kwargs()))
    registered = _registered(accelerator)
    for _ in loader:
        inside = registered.state_dict()
        break
    after = None
    for _ in loader:
        pass
    after = registered.state_dict()
    assert inside["inside_epoch"]["kind"] == "DataLoaderShard" and after["inside_epoch"] is None
    with caplog.at_level(logging.WARNING, logger="devrng"), \
            pytest.warns(devrng.DevRNGWarning, match=r"skip_first_batches starts the epoch again"):
        registered.load_state_dict(inside)
    assert any("skip_first_batches" in r.getMessage() for r in caplog.records)
    with caplog.at_level(logging.WARNING, logger="devrng"):
        caplog.clear()
        registered.load_state_dict(after)  # after the epoch's loop: nothing to say
    assert caplog.records == []


def test_register_seeds_at_once() -> None:
    accelerator = accelerate.Accelerator(cpu=True)
    register(accelerator, seed=11)
    first = torch.rand(3)
    register(accelerate.Accelerator(cpu=True), seed=11)
    assert torch.equal(first, torch.rand(3))  # a model built after register is seeded


def test_the_errors_name_registers_own_strict_false() -> None:
    registered = _registered(_accelerator_with())
    state = registered.state_dict()
    state["ranks"][0]["world_size"] = 2  # rank 0 of a run of 2
    state = resealed(state)  # as if devrng had written it so: the check behind the digest
    with pytest.raises(devrng.DevRNGError, match=r"rank 0 of 2, and this is rank 0 of 1\. Pass "
                                                 r"register\(accelerator, strict=False\)"):
        registered.load_state_dict(state)


def _accelerator_with(**config: Any) -> accelerate.Accelerator:
    """An Accelerator (its DataLoaderConfiguration from ``config``) with devrng registered."""
    accelerator = accelerate.Accelerator(
        cpu=True, dataloader_config=accelerate.utils.DataLoaderConfiguration(**config))
    register(accelerator, seed=3)
    return accelerator


def test_a_prepared_loaders_epoch_count_is_saved_and_put_back() -> None:
    """accelerate's seedable sampler shuffles by the prepared loader's epoch count, which
    save_state leaves out for a map-style dataset: the registered state carries it."""
    def prepared(accelerator: accelerate.Accelerator) -> Any:
        registered = _registered(accelerator)
        loader = accelerator.prepare(torch.utils.data.DataLoader(
            range(8), batch_size=2, shuffle=True, **registered.rng.dataloader_kwargs()))
        registered.rng.track("loader", loader)
        return registered, loader

    registered, loader = prepared(_accelerator_with(use_seedable_sampler=True))
    epoch0 = [b.tolist() for b in loader]
    epoch1 = [b.tolist() for b in loader]
    assert epoch0 != epoch1
    state = registered.state_dict()
    assert state["epochs"] == {"loader": 2}
    registered, loader = prepared(_accelerator_with(use_seedable_sampler=True))
    state = resealed({**state, "epochs": {"loader": 1}})  # as saved after the first epoch
    registered.load_state_dict(state)
    assert loader.iteration == 1


_CHANGES: dict[str, Any] = {
    "an epoch count": lambda s: {**s, "epochs": {"loader": 3}},
    "the key 'epochs'": lambda s: {("epochz" if k == "epochs" else k): v for k, v in s.items()},
    "inside_epoch": lambda s: {**s, "inside_epoch": None},
    "accumulating": lambda s: {**s, "accumulating": 2},
}


def test_every_part_of_the_registered_state_is_sealed(tmp_path: Any) -> None:
    """What register_for_checkpointing saves -- every rank's state, and beside it the place in
    the epoch, the accumulation window and the loaders' epoch counts (set_epoch'ed on load) --
    is sealed whole: a changed key or value is refused with a DevRNGError by
    accelerator.load_state and by load_state_dict before any generator or epoch count
    changes; devrng 0.4.0's unsealed state still loads."""
    accelerator = _accelerator_with(use_seedable_sampler=True)
    registered = _registered(accelerator)
    loader = accelerator.prepare(torch.utils.data.DataLoader(
        range(8), batch_size=2, shuffle=True, **registered.rng.dataloader_kwargs()))
    registered.rng.track("loader", loader)
    for _ in loader:
        break  # inside the epoch's loop
    accelerator.save_state(tmp_path / "state")
    [saved] = (tmp_path / "state").glob("custom_checkpoint_*.pkl")
    intact = torch.load(saved, weights_only=True)
    assert intact["epochs"] == {"loader": 0} and intact["inside_epoch"] is not None
    for name, change in _CHANGES.items():
        changed = change(intact)
        before = devrng.get_rng_state(), loader.iteration
        with pytest.raises(devrng.DevRNGError, match=r"devrng.integrations.accelerate: the "
                                                     r"state was altered or damaged after"):
            registered.load_state_dict(changed)
        assert (devrng.get_rng_state(), loader.iteration) == before, name
        torch.save(changed, saved)
        with pytest.raises(devrng.DevRNGError, match=r"the state was altered or damaged"):
            accelerator.load_state(tmp_path / "state")
    torch.save(intact, saved)
    with pytest.warns(devrng.DevRNGWarning, match="skip_first_batches"):
        accelerator.load_state(tmp_path / "state")
    unsealed = {key: intact[key] for key in ("ranks", "inside_epoch", "accumulating", "epochs")}
    with pytest.warns(devrng.DevRNGWarning, match="skip_first_batches"):
        registered.load_state_dict(unsealed)  # as devrng 0.4.0 wrote it

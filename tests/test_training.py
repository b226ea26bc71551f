"""devrng.TrainingRNG: seeding, what its state holds, and loading it all or nothing.

The bitwise resume of whole training runs in fresh processes is tests/test_resume.py;
this file checks the object's contract piece by piece. Devices other than the CPU are
SIMULATED here (tests/_fakes.py) where a device count must change.
"""

from __future__ import annotations

import io
import logging
import os
import random
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from tests._fakes import FaultyBackend, MinimalBackend, registered
from tests._helpers import generator_states, plain_state, resealed

import devrng
from devrng import DevRNGError, TrainingRNG


@pytest.fixture(autouse=True)
def _seed_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEVRNG_SEED", raising=False)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


# ----------------------------------------------------------------------------- seeding
def test_a_given_seed_seeds_torch_python_and_numpy_like_manual_seed() -> None:
    TrainingRNG(77)
    got = (torch.rand(3), random.random(), np.random.random())
    devrng.manual_seed(77)
    assert torch.equal(got[0], torch.rand(3))
    assert (got[1], got[2]) == (random.random(), np.random.random())


def test_seed_comes_from_the_environment_then_from_entropy(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PL_GLOBAL_SEED", "42")
    assert TrainingRNG().seed == 42
    monkeypatch.setenv("DEVRNG_SEED", "9")  # devrng's own variable wins
    assert TrainingRNG().seed == 9
    monkeypatch.delenv("DEVRNG_SEED")
    monkeypatch.delenv("PL_GLOBAL_SEED")
    with caplog.at_level(logging.INFO, logger="devrng"):
        rng = TrainingRNG()
    assert f"seed {rng.seed} (drawn from OS entropy)" in caplog.text
    assert os.environ["DEVRNG_SEED"] == str(rng.seed)  # for processes started later
    assert TrainingRNG().seed == rng.seed  # a second one in this process agrees


def test_a_bad_seed_variable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVRNG_SEED", "twelve")
    with pytest.raises(ValueError, match="The DEVRNG_SEED environment variable is 'twelve'"):
        TrainingRNG()


def test_deterministic_applies_the_switches() -> None:
    rng = TrainingRNG(1, deterministic=True)
    try:
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        assert rng.determinism is not None
        rng.determinism.restore()
    assert not torch.are_deterministic_algorithms_enabled()


def test_per_rank_seeds_differ_by_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    TrainingRNG(5, per_rank=True)
    rank1 = torch.rand(2)
    monkeypatch.setenv("RANK", "0")
    TrainingRNG(5, per_rank=True)
    assert not torch.equal(rank1, torch.rand(2))
    TrainingRNG(5)
    same = torch.rand(2)
    monkeypatch.setenv("RANK", "1")
    TrainingRNG(5)
    assert torch.equal(same, torch.rand(2))  # by default every rank gets the seed


# ----------------------------------------------------------------------------- what it covers
def test_dataloader_kwargs_chain_the_users_worker_init_fn(tmp_path: Any) -> None:
    calls = tmp_path / "calls"
    calls.mkdir()

    def mine(worker_id: int) -> None:
        (calls / str(worker_id)).write_text(str(torch.initial_seed()))

    rng = TrainingRNG(3)
    kwargs = rng.dataloader_kwargs(worker_init_fn=mine)
    loader = torch.utils.data.DataLoader(range(4), num_workers=2, **kwargs)
    list(loader)
    assert sorted(p.name for p in calls.iterdir()) == ["0", "1"]  # the user's ran in each
    seeds = {p.read_text() for p in calls.iterdir()}
    assert len(seeds) == 2  # after devrng's seeding: distinct per worker


def test_each_loader_gets_its_own_generator_in_the_state() -> None:
    rng = TrainingRNG(3)
    a, b = rng.dataloader_kwargs()["generator"], rng.dataloader_kwargs()["generator"]
    assert not torch.equal(a.get_state(), b.get_state())
    assert set(plain_state(rng.state_dict())["generators"]) == {"dataloader0", "dataloader1"}


def test_track_takes_state_objects_and_refuses_others() -> None:
    rng = TrainingRNG(3)
    step = devrng.seeded_jit(lambda x: x, backend="eager")
    assert rng.track("step", step) is step
    streams = rng.track("streams", devrng.RNGStreams())
    streams.add("dropout", 1)
    gen = rng.track("noise", torch.Generator().manual_seed(8))
    state = plain_state(rng.state_dict())
    assert state["tracked"]["step"] == step.state_dict()
    assert torch.equal(state["generators"]["noise"], gen.get_state())
    with pytest.raises(ValueError, match="already tracks an object named 'step'"):
        rng.track("step", step)
    with pytest.raises(TypeError, match=r"got 5 \(of type int\), which has no state_dict\(\)"):
        rng.track("number", 5)
    with pytest.raises(TypeError, match="non-empty string name"):
        rng.track("", step)


@pytest.mark.parametrize(("make", "what"), [
    (lambda: torch.nn.Linear(2, 2), r"a model \(Linear\)"),
    (lambda: torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), r"an optimizer \(SGD\)"),
    (lambda: torch.optim.lr_scheduler.StepLR(
        torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), 1),
     r"an LR scheduler \(StepLR\)"),
])
def test_track_refuses_a_model_optimizer_or_scheduler(make: Callable[[], Any], what: str) -> None:
    """Their state_dict() would put the weights inside the RNG state: refused with the fix."""
    rng = TrainingRNG(3)
    before = rng.state_dict()
    with pytest.raises(TypeError, match=rf"track\('model', \.\.\.\) got {what}, whose state "
                                        r"belongs in your checkpoint next to devrng's"):
        rng.track("model", make())
    after = plain_state(rng.state_dict())
    assert after.keys() == plain_state(before).keys() and not after["tracked"]


def test_state_dict_is_plain_data_that_loads_weights_only() -> None:
    rng = TrainingRNG(3)
    rng.track("loader", torch.utils.data.DataLoader(range(4), **rng.dataloader_kwargs()))
    rng.track("step", devrng.seeded_jit(lambda x: x, backend="eager"))
    buffer = io.BytesIO()
    torch.save(rng.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    rng.load_state_dict(loaded)
    assert list(loaded) == ["devrng_rank_0"]  # one rank's entry, which DCP keeps apart
    plain = plain_state(loaded)
    assert plain["format"] == "devrng.TrainingRNG" and plain["version"] == 3
    assert plain["devrng_version"] == devrng.__version__ and len(plain["digest"]) == 64
    assert plain["loaders"]["loader"]["kind"] == "DataLoader"  # the loader, as plain data


def test_a_tracked_object_with_an_opaque_state_is_refused() -> None:
    class Opaque:
        def state_dict(self) -> dict[str, Any]:
            return {"thing": object()}

        def load_state_dict(self, sd: dict[str, Any]) -> None:
            pass

    rng = TrainingRNG(3)
    rng.track("opaque", Opaque())
    with pytest.raises(DevRNGError, match="tracked object 'opaque' is a object, which a "
                                          "weights-only file cannot hold"):
        rng.state_dict()


# ----------------------------------------------------------------------------- loading
@pytest.fixture
def setup() -> tuple[TrainingRNG, Any, Any, dict[str, Any]]:
    rng = TrainingRNG(11)
    loader = torch.utils.data.DataLoader(range(6), shuffle=True, **rng.dataloader_kwargs())
    step = rng.track("step", devrng.seeded_jit(lambda x: x + torch.rand(1), backend="eager"))
    step(torch.zeros(1))
    return rng, loader, step, plain_state(rng.state_dict())


def _snapshot(loader: Any, step: Any) -> tuple[Any, ...]:
    return generator_states(loader.generator), step.state_dict()


def test_load_puts_everything_back(setup: Any) -> None:
    rng, loader, step, saved = setup
    first = ([int(x) for x in loader], step(torch.zeros(1)), torch.rand(2))
    rng.load_state_dict(saved)
    again = ([int(x) for x in loader], step(torch.zeros(1)), torch.rand(2))
    assert first[0] == again[0]
    assert torch.equal(first[1], again[1]) and torch.equal(first[2], again[2])


@pytest.mark.parametrize(("change", "message"), [
    (lambda sd: sd.update(extra=1), r"the state has unknown keys 'extra'\."),
    (lambda sd: sd.pop("generators"), r"the state lacks \['generators'\]"),
    (lambda sd: sd.update(format="x"), r"takes the dict that TrainingRNG.state_dict\(\) returns; "
                                        r"its format tag is 'x', not 'devrng.TrainingRNG'\."),
    (lambda sd: sd.update(version=9), "the state is version 9"),
    (lambda sd: sd["tracked"].pop("step"), r"nothing was saved for the tracked objects 'step', "
                                            r"which are tracked here"),
    (lambda sd: sd["tracked"].update(other={}), r"the checkpoint holds tracked objects 'other', "
                                                r"which nothing here tracks"),
    (lambda sd: sd["generators"].update(dataloader0=torch.zeros(3, dtype=torch.uint8)),
     "generator 'dataloader0' is not a CPU generator state"),
    (lambda sd: sd.update(rank=3, world_size=4), "saved by rank 3 of 4, and this is rank 0 of 1"),
    (lambda sd: sd["rng"].update(cpu=torch.zeros(2)), "saved global RNG state is not a valid devrng RNG snapshot"),
    (lambda sd: sd["tracked"]["step"].update(counter=-1), r"counter'\] must be an int in \[0, 2\*\*63\), not -1"),
])
def test_a_bad_state_changes_nothing(setup: Any, change: Any, message: str) -> None:
    rng, loader, step, saved = setup
    list(loader)
    step(torch.zeros(1))
    torch.rand(1)
    before = _snapshot(loader, step)
    change(saved)
    with pytest.raises(DevRNGError, match=message):  # sealed again: the check behind the digest
        rng.load_state_dict(resealed(saved))
    assert before == _snapshot(loader, step)
    # As changed, under the digest written before: the digest refuses it (its header first).
    with pytest.raises(DevRNGError, match=r"was altered or damaged after devrng|format tag is "
                                          r"'x'|version 9"):
        rng.load_state_dict(saved)
    assert before == _snapshot(loader, step)


def test_a_bad_generator_state_is_refused_even_where_strict_false_would_skip_it(
        setup: Any) -> None:
    # Every saved generator state is checked with the rest of the state, before anything is
    # read: also one that strict=False would skip because nothing here tracks its name.
    rng, loader, step, saved = setup
    before = _snapshot(loader, step)
    saved["generators"]["dataloader7"] = torch.zeros(3, dtype=torch.uint8)
    with pytest.raises(DevRNGError, match=r"generator 'dataloader7' is not a CPU generator "
                                          r"state: is a torch.uint8 tensor of shape \(3,\)"):
        rng.load_state_dict(resealed(saved), strict=False)
    assert before == _snapshot(loader, step)


@pytest.mark.parametrize(("state", "got"), [(None, r"it is None\."),
                                           (3, r"it is 3 \(of type int\)\.")])
def test_something_that_is_not_a_state_is_named_in_the_error(state: Any, got: str) -> None:
    with pytest.raises(DevRNGError, match=r"takes the dict that TrainingRNG.state_dict\(\) "
                                          r"returns; " + got):
        TrainingRNG(1).load_state_dict(state)


def test_a_failure_while_applying_puts_tracked_objects_back(setup: Any) -> None:
    rng, loader, step, saved = setup
    with registered("faulty", FaultyBackend("faulty")) as faulty:
        saved = plain_state(rng.state_dict())  # now with the faulty backend's two devices
        step(torch.zeros(1))
        before = _snapshot(loader, step)
        faulty.faults["set"] = RuntimeError("device lost")
        with pytest.raises(DevRNGError, match="device lost"):
            rng.load_state_dict(saved)
        faulty.faults.clear()
        assert before == _snapshot(loader, step)  # the step counter was loaded, then put back


def test_fewer_devices_strict_refuses_and_lenient_resumes_with_a_warning() -> None:
    big = MinimalBackend(count=8, name="simdev")
    with registered("simdev", big):  # SIMULATED: 8 devices when saved
        rng = TrainingRNG(21)
        saved = plain_state(rng.state_dict())
    small = MinimalBackend(count=4, name="simdev")
    with registered("simdev", small):  # ... and 4 on resume
        rng = TrainingRNG(21)
        before = [g.get_state() for g in small.gens]
        with pytest.raises(DevRNGError, match=r"the state holds simdev devices \[4, 5, 6, 7\], "
                                              r"and this process has 4 simdev device\(s\)\. "
                                              r"Pass strict=False"):
            rng.load_state_dict(saved)
        assert all(torch.equal(a, g.get_state()) for a, g in zip(before, small.gens, strict=True))
        with pytest.warns(UserWarning, match=r"did not restore: simdev devices \[4, 5, 6, 7\] "
                                             r"\(this process has 4\)"):
            rng.load_state_dict(saved, strict=False)
        assert all(torch.equal(saved["rng"]["devices"]["simdev"][i], small.gens[i].get_state())
                   for i in range(4))


def test_more_devices_lenient_seeds_the_new_ones_from_the_seed() -> None:
    with registered("simdev", MinimalBackend(count=2, name="simdev")):  # SIMULATED: 2 devices when saved
        saved = plain_state(TrainingRNG(21).state_dict())
    grown = MinimalBackend(count=4, name="simdev")
    with registered("simdev", grown):  # ... and 4 on resume
        rng = TrainingRNG(21)
        before = grown.gens[2].get_state()
        with pytest.warns(UserWarning, match=r"simdev devices \[2, 3\] \(none saved: seeded "
                                             r"from the seed and this rank\)"):
            rng.load_state_dict(saved, strict=False)
        assert torch.equal(grown.gens[0].get_state(), saved["rng"]["devices"]["simdev"][0])
        derived = grown.gens[2].get_state()
        assert not torch.equal(derived, before)
        torch.rand(3, generator=grown.gens[2])
        with pytest.warns(UserWarning, match="simdev devices"):
            rng.load_state_dict(saved, strict=False)
        assert torch.equal(grown.gens[2].get_state(), derived)  # from the seed: the same again


def test_another_ranks_state_restores_data_position_not_its_streams(
        setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rng, loader, step, saved = setup
    saved["rank"], saved["world_size"] = 1, 2
    saved = resealed(saved)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DevRNGError, match="saved by rank 1 of 2, and this is rank 0 of 2"):
        rng.load_state_dict(saved)
    with pytest.warns(UserWarning, match="the global generators of rank 1"):
        rng.load_state_dict(saved, strict=False)
    assert step.state_dict() == saved["tracked"]["step"]
    assert torch.equal(loader.generator.get_state(), saved["generators"]["dataloader0"])
    # This rank's own stream, not rank 1's: derived from the seed and rank 0.
    assert devrng.get_rng_state(devices=[]) != devrng.RNGState.from_dict(saved["rng"])
    ours = torch.rand(2)
    devrng.manual_seed(devrng.distributed.rank_seed(11, 0))
    assert torch.equal(ours, torch.rand(2))


def test_a_torchrun_rank_before_its_process_group_resumes_exactly_and_silently(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """WORLD_SIZE=2 RANK=0 and no process group (a torchrun rank before init_process_group):
    the state records rank 0 of 2, and the load checks against the same two numbers."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    rng = TrainingRNG(seed=4)
    saved = rng.state_dict()
    assert list(saved) == ["devrng_rank_0"]
    assert (plain_state(saved)["rank"], plain_state(saved)["world_size"]) == (0, 2)
    want = torch.rand(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "saved by 2 ranks and this job has 1" was a warning
        rng.load_state_dict(saved)
    assert torch.equal(torch.rand(3), want)


def test_the_devrng_values_of_one_dcp_load_load_together(tmp_path: Any) -> None:
    """dcp.load calls load_state_dict value by value, in key order: when the RNGStreams under
    "streams" refuses, the TrainingRNG under "rng" has loaded; it is put back. (One process;
    the torch versions of every environment, whose dcp.load names its locals differently.)"""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    rng, streams = TrainingRNG(seed=5), devrng.RNGStreams()
    streams.add("a", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is ... uninitialized"
        # Two writer threads: with one, torch 2.9's writer takes the stream of the
        # PrivateUse1 device when one is available (torchax's 'jax', once a test imported
        # torchax), and torchax's device module has no current_stream (an upstream bug).
        writer = dcp.FileSystemWriter(str(tmp_path), thread_count=2)
        dcp.save({"rng": rng, "streams": streams}, storage_writer=writer, no_dist=True)
        torch.rand(3)
        before = devrng.get_rng_state().fingerprint()
        other = devrng.RNGStreams()
        other.add("b", 2)
        with pytest.raises(DevRNGError, match=r"this rank's streams are 'b' \(seed 2\).* The "
                                              r"devrng values this dcp.load loaded before it "
                                              r"\('rng'\) were put back as well\."):
            dcp.load({"rng": rng, "streams": other}, checkpoint_id=str(tmp_path), no_dist=True)
        assert devrng.get_rng_state().fingerprint() == before
        dcp.load({"rng": rng, "streams": streams}, checkpoint_id=str(tmp_path), no_dist=True)
    assert devrng.get_rng_state().fingerprint() != before  # both loaded


@pytest.mark.parametrize("form", ["state_dict()", "its plain dict"])
def test_resume_adopts_the_saved_seed_and_warns_when_another_was_chosen(
        setup: Any, form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A TrainingRNG made with seed 99 that loads a checkpoint of seed 11 continues the run
    of seed 11: on one process it says so (several processes refuse it, tests/test_dcp.py)."""
    rng, _loader, _step, saved = setup
    if form == "state_dict()":
        saved = rng.state_dict()

    def made(seed: int | None) -> TrainingRNG:
        other = TrainingRNG(seed)
        other.dataloader_kwargs()
        other.track("step", devrng.seeded_jit(lambda x: x, backend="eager"))
        return other

    other = made(99)
    with pytest.warns(devrng.DevRNGWarning, match=r"this TrainingRNG was made with seed 99 and "
                      r"the checkpoint's run used seed 11; it continues that run, with seed 11\. "
                      r"Make it with seed=11") as caught:
        other.load_state_dict(saved)
    assert [w.filename for w in caught] == [__file__]  # the warning points at the call
    assert other.seed == 11
    assert os.environ["DEVRNG_SEED"] == "11"
    monkeypatch.delenv("DEVRNG_SEED")
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    for seed in (None, 11):  # a seed from entropy, or the checkpoint's own: nothing to say
        quiet = made(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            quiet.load_state_dict(saved)
        assert quiet.seed == 11


def test_repr_names_what_it_tracks(setup: Any) -> None:
    rng = setup[0]
    assert repr(rng) == "TrainingRNG(seed=11, tracking dataloader0, step)"


def test_a_resume_warning_made_an_error_changes_nothing() -> None:
    """With warnings as errors (``-W error``), a lenient resume that would warn fails with a
    DevRNGError naming the warning and leaves every generator, tracked object and the seed
    as they were: the warnings are the last step of the load, inside its undo."""
    with registered("simdev", MinimalBackend(count=2, name="simdev")):  # SIMULATED device
        saved = plain_state(TrainingRNG(21).state_dict())
    grown = MinimalBackend(count=4, name="simdev")
    with registered("simdev", grown):
        rng = TrainingRNG(5)
        loader = rng.track("loader", torch.utils.data.DataLoader(
            range(8), batch_size=2, shuffle=True, **rng.dataloader_kwargs()))
        step = rng.track("noise", torch.Generator().manual_seed(9))
        saved_here = plain_state(rng.state_dict())
        saved_here["rng"] = saved["rng"]  # the 2-device state: devices 2 and 3 seeded anew
        saved_here = resealed(saved_here)
        torch.rand(5)
        before = generator_states(grown, loader.generator, step)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(DevRNGError, match=r"\(DevRNGWarning: .*simdev devices \[2, 3\].*"
                                                  r"every generator was put back"):
                rng.load_state_dict(saved_here, strict=False)
        assert generator_states(grown, loader.generator, step) == before
        assert rng.seed == 5 and os.environ["DEVRNG_SEED"] == "5"
        with pytest.warns(devrng.DevRNGWarning, match=r"simdev devices \[2, 3\]"):
            rng.load_state_dict(saved_here, strict=False)  # without the filter: restored
        assert generator_states(grown, loader.generator, step) != before


def test_a_dataloader_generator_made_too_late_is_named_with_the_fix() -> None:
    """The generators dataloader_kwargs() makes must exist before the load (Lightning calls
    train_dataloader after restoring callbacks): the refusal says how to fix it."""
    rng = TrainingRNG(3)
    rng.dataloader_kwargs()
    saved = rng.state_dict()
    fresh = TrainingRNG(3)
    with pytest.raises(DevRNGError, match=r"holds generators 'dataloader0', which nothing here "
                                          r"tracks \(dataloader_kwargs\(\) makes .* before "
                                          r"fit, not inside train_dataloader\)"):
        fresh.load_state_dict(saved)
    fresh.dataloader_kwargs()
    fresh.load_state_dict(saved)  # made before the load: restored
    fresh.dataloader_kwargs()  # one more than the run that saved
    with pytest.raises(DevRNGError, match="nothing was saved for the generators 'dataloader1'"
                                          r".*\(dataloader_kwargs\(\) makes"):
        fresh.load_state_dict(saved)

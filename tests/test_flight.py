"""The flight record: exact digests, a line per optimizer step, resumes verified or the first
differing step named, and ``devrng check-resume``."""

from __future__ import annotations

import copy
import json
import logging
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests._helpers import plain_state, resealed, run_python
from tests._internals import (
    batch_digest,
    compare_module,
    digest_module,
    explain,
    flight_module,
    generator_fingerprint,
    indices_digest,
    numpy_fingerprint,
    python_fingerprint,
    read_record,
)

import devrng

# -- digests ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int32, torch.int8, torch.uint8,
                                   torch.bool, torch.complex64])
def test_a_batch_digest_sees_one_changed_element_of_every_dtype(dtype: torch.dtype) -> None:
    base = (torch.arange(60) % 7).to(dtype).reshape(6, 10)
    changed = base.clone()
    changed.view(-1)[37] = 1 if dtype is torch.bool and not changed.view(-1)[37] else 0
    if torch.equal(changed, base):
        changed.view(-1)[37] = 5
    assert batch_digest(base) == batch_digest(base.clone())
    assert batch_digest(base) != batch_digest(changed)


def test_a_batch_digest_sees_two_samples_trade_places_and_not_the_memory_layout() -> None:
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(0))
    swapped = x[[1, 0, 2, 3, 4, 5, 6, 7]]
    assert batch_digest(x) != batch_digest(swapped)  # a plain sum would not see it
    assert batch_digest(x.t().contiguous().t()) == batch_digest(x)  # same values, other strides
    assert batch_digest(x[:, ::2]) == batch_digest(x[:, ::2].contiguous())


def test_a_batch_digest_covers_the_structure_numbers_strings_and_arrays() -> None:
    x = torch.ones(2, 3)
    assert batch_digest({"x": x, "y": [1, 2]}) != batch_digest({"x": x, "z": [1, 2]})
    assert batch_digest((x, 1)) != batch_digest((x, 2))
    assert batch_digest((x, "a")) != batch_digest((x, "b"))
    assert batch_digest((x, 0.5)) != batch_digest((x, 0.25))
    assert batch_digest(np.arange(4)) == batch_digest(torch.arange(4))
    assert batch_digest(x) != batch_digest(x.double())  # dtype is part of it
    assert batch_digest(x) != batch_digest(x.reshape(3, 2))  # and shape


def test_a_large_tensor_is_digested_on_runs_of_elements_spread_over_it() -> None:
    """Past SAMPLED elements, RUNS runs of RUN consecutive elements (the docs say so): an
    element inside a run is seen, one between two runs is not, and a change to every sample
    (augmentation) is."""
    runs, run = digest_module.RUNS, digest_module.RUN
    x = torch.zeros(64, 3 * 32 * 32)
    stride = x.numel() // runs
    seen, unseen = x.clone(), x.clone()
    seen.view(-1)[stride * 10 + run - 1] = 1.0
    unseen.view(-1)[stride * 10 + run] = 1.0
    assert runs * run == digest_module.SAMPLED
    assert batch_digest(seen) != batch_digest(x)
    assert batch_digest(unseen) == batch_digest(x)
    assert batch_digest(x + torch.rand(x.shape) * 1e-3) != batch_digest(x)


def test_indices_digest_is_the_order_of_the_indices() -> None:
    assert indices_digest([1, 2, 3]) == indices_digest([1, 2, 3])
    assert indices_digest([1, 2, 3]) != indices_digest([2, 1, 3])
    assert indices_digest(torch.tensor([1, 2, 3])) == indices_digest([1, 2, 3])
    assert indices_digest(["a", "b"]) != indices_digest(["b", "a"])  # not ints: by repr


def test_fingerprints_follow_the_generators_and_read_nothing_twice() -> None:
    g = torch.Generator().manual_seed(1)
    before = generator_fingerprint(g)
    torch.rand(3, generator=g)
    assert generator_fingerprint(g) != before
    g.manual_seed(1)
    assert generator_fingerprint(g) == before
    np_read = numpy_fingerprint()
    assert np_read is not None
    state, py_state = np.random.get_state(), random.getstate()
    a, b = np_read(), python_fingerprint()
    np.random.rand()
    random.random()
    assert np_read() != a and python_fingerprint() != b
    np.random.set_state(state)
    random.setstate(py_state)
    assert np_read() == a and python_fingerprint() == b


def test_the_numpy_fingerprint_reads_the_live_state_after_reseeding() -> None:
    """The fast reader reads NumPy's C state in place: reseeding (which rewrites it there)
    and a replaced global generator (which it must not read through a stale address) both
    change what it returns."""
    read = numpy_fingerprint()
    assert read is not None
    np.random.seed(3)
    a = read()
    np.random.seed(4)
    assert read() != a
    np.random.seed(3)
    assert read() == a
    old = np.random.mtrand._rand
    try:
        np.random.mtrand._rand = np.random.RandomState(3)
        assert read() != ""  # the slow road, no crash
    finally:
        np.random.mtrand._rand = old


# -- the record in a loop -------------------------------------------------------------------

def _loop(directory: Path, steps: int, *, accumulate: int = 1, workers: int = 0,
          flight: bool = True, save_at: int | None = None, seed: int = 5,
          resume: dict[str, Any] | None = None, draw_at: int | None = None,
          save_in_loop: bool = False, lr: float = 0.1, loss_at: str = "before_step",
          nondeterministic_at: int | None = None) -> dict[str, Any]:
    """A plain loop in this process, the record in ``directory``: its losses, what it saved
    at step ``save_at`` (``resume`` it in a later loop), the generators' fingerprint at the
    end; ``draw_at``: one NumPy draw before that step, which an earlier run did not make.
    A step that ends an epoch saves after the epoch's loop (as the docs advise), or with
    ``save_in_loop`` inside it, before the loader is asked for the batch after its last.
    ``loss_at``: where the loop gives the record its loss: ``"before_step"`` (after
    backward), ``"after_step"`` (after ``opt.step()``, as the docs show), ``"none"``;
    ``nondeterministic_at``: that step's gradient gets a tiny change of its own (as a
    nondeterministic kernel would make), which the batch and generators do not show."""
    rng = devrng.TrainingRNG(seed, flight_record=directory if flight else None)
    data = torch.utils.data.TensorDataset(torch.linspace(0, 1, 160).reshape(40, 4),
                                          torch.linspace(1, 0, 40).reshape(40, 1))
    loader = rng.track("loader", torch.utils.data.DataLoader(
        data, batch_size=4, shuffle=True, num_workers=workers, **rng.dataloader_kwargs()))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    done = 0
    if resume is not None:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["opt"])
        rng.load_state_dict(resume["rng"])
        done = resume["step"]
    losses: list[float] = []
    saved = None
    micro = 0

    def save() -> dict[str, Any]:
        return {"rng": rng.state_dict(), "model": copy.deepcopy(model.state_dict()),
                "opt": copy.deepcopy(opt.state_dict()), "step": done}

    while done < steps:
        for i, (x, y) in enumerate(loader):
            if done + 1 == draw_at and micro % accumulate == 0:
                np.random.rand()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            if done + 1 == nondeterministic_at:
                with torch.no_grad():
                    model[0].weight.grad[0, 0] += 1e-6
            if rng.flight is not None and loss_at == "before_step":
                rng.flight.loss(loss)
            micro += 1
            if micro % accumulate:
                continue
            opt.step()
            if rng.flight is not None and loss_at == "after_step":
                rng.flight.loss(loss)
            opt.zero_grad()
            done += 1
            losses.append(loss.item())
            if done == save_at and (save_in_loop or i + 1 < len(loader)):
                saved = save()
            if done == steps:
                break
        if done == save_at and saved is None:
            saved = save()
    verified = early = verdict = None
    if rng.flight is not None:
        early = rng.flight.verified  # said at the last compared step, not at the end
        rng.flight.finish()  # the last steps written and compared
        verified = rng.flight.verified
        verdict = rng.flight.verdict
        rng.flight.close()
    return {"losses": losses, "saved": saved, "after": devrng.get_rng_state().fingerprint(),
            "verified": verified, "verified_before_the_end": early,
            "verdict": verdict}


def test_one_line_per_optimizer_step_of_a_few_hundred_bytes(tmp_path: Path) -> None:
    _loop(tmp_path, 6, save_at=3)
    record = read_record(str(tmp_path / "devrng-flight.rank0.jsonl"))
    (attempt,) = record["attempts"].values()
    assert sorted(attempt["steps"]) == [1, 2, 3, 4, 5, 6]
    assert attempt["checkpoints"] == [3]
    lines = (tmp_path / "devrng-flight.rank0.jsonl").read_bytes().splitlines()
    steps = [line for line in lines if line.startswith(b'{"s":')]
    assert len(steps) == 6 and max(map(len, steps)) <= 400, max(map(len, steps))
    line, names = attempt["steps"][2]
    # (and every started device: XLA where torch_xla is in use)
    assert [n for n in names if ":" not in n or n.startswith("loader:")] == [
        "cpu", "python", "numpy", "loader:dataloader0"]
    assert line["n"] == 1 and len(line["b"]) == 16 and len(line["i"]) == 16
    assert line["p"] == ["loader", 1]  # the second batch of its epoch
    assert float.fromhex(line["l"][0]) > 0


def test_a_step_is_an_optimizer_step_and_holds_its_micro_batches(tmp_path: Path) -> None:
    _loop(tmp_path, 3, accumulate=2)
    (attempt,) = read_record(str(tmp_path / "devrng-flight.rank0.jsonl"))["attempts"].values()
    assert sorted(attempt["steps"]) == [1, 2, 3]
    assert all(line["n"] == 2 and len(line["l"]) == 2 for line, _ in attempt["steps"].values())


def test_the_record_only_reads_a_run_draws_the_same_with_it_on(tmp_path: Path) -> None:
    """With workers, checkpoints and losses recorded: the same losses and the same
    generators at the end, bitwise, with the record on and off."""
    on = _loop(tmp_path, 12, workers=2, save_at=5)
    off = _loop(tmp_path, 12, workers=2, save_at=5, flight=False)
    assert on["losses"] == off["losses"]
    assert on["after"] == off["after"]


def test_a_resume_in_this_process_is_verified(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    # 10 steps an epoch: a checkpoint at an epoch's end resumes exactly with a DataLoader.
    first = _loop(tmp_path, 16, save_at=10)  # records steps 11 to 16 past its checkpoint
    with caplog.at_level(logging.INFO, logger="devrng"), warnings.catch_warnings():
        warnings.simplefilter("error")  # no DevRNGWarning
        again = _loop(tmp_path, 16, resume=first["saved"])
    assert again["losses"] == first["losses"][10:]
    assert again["verified"] is True and again["verified_before_the_end"] is True
    verdict = again["verdict"]  # the value the sentence is said from
    assert (verdict.ok, verdict.steps, verdict.difference) == (True, (11, 16), None)
    assert any("resume verified: steps 11 to 16 drew, consumed and computed exactly what the "
               "interrupted run did (compared: generators, batch indices, batch content, loss, "
               "parameters at every step)" in m for m in caplog.messages), caplog.messages


def test_the_first_differing_step_and_its_cause_are_named_once(tmp_path: Path) -> None:
    first = _loop(tmp_path, 16, save_at=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = _loop(tmp_path, 16, resume=first["saved"], draw_at=13)
    found = [str(w.message) for w in caught if w.category is devrng.DevRNGWarning]
    assert len(found) == 1, found
    # Drawn during step 13, after it took its batch: seen when step 14 starts.
    assert ("differs from the interrupted one at step 14 (batch 4 of its epoch from loader "
            "'loader'): at the step's start the generator numpy differed (cpu, ") in found[0]
    assert "python, dataloader0 matched)" in found[0], found
    assert "Steps 11 to 13 matched." in found[0]
    assert again["verified"] is False
    difference = again["verdict"].difference  # the value the warning is said from
    assert (difference.step, difference.part) == (14, "generators")
    assert str(again["verdict"]) in found[0]


def test_a_save_inside_the_loop_after_an_epochs_last_batch_is_flagged(tmp_path: Path) -> None:
    """A class devrng does not list: torch's RandomSampler draws once more when the loader
    is asked for the batch after the epoch's last, so a checkpoint written inside the loop
    after that batch misses the draw. The record names it at the next epoch's first step."""
    first = _loop(tmp_path, 16, save_at=10, save_in_loop=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = _loop(tmp_path, 16, resume=first["saved"])
    assert again["losses"] != first["losses"][10:]  # not exact, indeed
    found = [str(w.message) for w in caught if w.category is devrng.DevRNGWarning]
    assert len(found) == 1, found
    assert ("at step 11 (batch 1 of its epoch from loader 'loader'): the batch holds other "
            "samples (its indices differ) (the loader's generator dataloader0 differed at the "
            "step's start too): the loader's sampler shuffled differently") in found[0], found


def test_a_run_that_recorded_nothing_past_its_checkpoint_cannot_be_verified_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = _loop(tmp_path, 4, save_at=4)  # saved at its last step
    with caplog.at_level(logging.INFO, logger="devrng"), warnings.catch_warnings():
        warnings.simplefilter("error")  # not a warning
        rng = devrng.TrainingRNG(5, flight_record=tmp_path)
        rng.dataloader_kwargs()
        rng.load_state_dict(first["saved"]["rng"])
    # (That run ended at its checkpoint; a run killed there: the kill tests below.)
    assert any("cannot be verified: the run that saved this checkpoint ended there (step 4), "
               "so no step of it follows the checkpoint to compare with" in m
               for m in caplog.messages), caplog.messages
    assert rng.flight is not None and rng.flight.verified is None
    rng.flight.close()


def test_a_checkpoint_the_record_does_not_know_is_said_not_compared(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = _loop(tmp_path / "elsewhere", 6, save_at=3)
    with caplog.at_level(logging.INFO, logger="devrng"):
        rng = devrng.TrainingRNG(5, flight_record=tmp_path / "here")
        rng.dataloader_kwargs()
        rng.load_state_dict(first["saved"]["rng"])
    assert any("holds no checkpoint at all: the checkpoint was saved with the record kept "
               "elsewhere" in m for m in caplog.messages), caplog.messages
    assert rng.flight is not None
    rng.flight.close()


def test_a_record_of_another_rank_is_never_compared_silently(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = _loop(tmp_path, 6, save_at=3, seed=5)
    path = tmp_path / "devrng-flight.rank0.jsonl"
    lines = path.read_text().splitlines()
    # The same checkpoint, as if the record had been written by another rank.
    header = json.loads(lines[0].rpartition(" ")[0])
    header["id"]["rank"] = 1
    lines[0] = compare_module.encode_line(header).rstrip("\n")
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.INFO, logger="devrng"):
        rng = devrng.TrainingRNG(5, flight_record=tmp_path)
        rng.dataloader_kwargs()
        rng.load_state_dict(first["saved"]["rng"])
    assert any("not compared with the run that wrote it: it ran as another rank or world size "
               "(rank 1 then, 0 now)" in m for m in caplog.messages), caplog.messages
    assert rng.flight is not None
    rng.flight.close()


# -- a record speaks only of its own run (issue 44 section 1) ---------------------------------

def _flight_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "flight record" in str(w.message)]


def test_an_earlier_run_in_the_same_folder_is_never_compared(tmp_path: Path,
                                                            capfd: pytest.CaptureFixture[str]
                                                            ) -> None:
    # An earlier run of the same seed and data (another learning rate) saved at step 10 and
    # went on; this run saved at step 10 too (the same generator states), was stopped after
    # step 12, and resumes: it is compared with its own steps 11 and 12, never the other's.
    _loop(tmp_path, 16, save_at=10, lr=0.5)
    mine = _loop(tmp_path, 12, save_at=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = _loop(tmp_path, 16, resume=mine["saved"])
    assert _flight_warnings(caught) == []
    assert again["verified"] is True
    assert "resume verified: steps 11 to 12 drew, consumed and computed exactly" in \
        capfd.readouterr().err


def test_a_record_left_by_another_run_is_said_to_be_another_runs_once(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    other, mine = tmp_path / "other", tmp_path / "mine"
    _loop(other, 12, save_at=10)
    saved = _loop(mine, 12, save_at=10)["saved"]  # the same seed: the same generator states
    record = "devrng-flight.rank0.jsonl"
    (mine / record).write_bytes((other / record).read_bytes())  # copied beside the checkpoint
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = _loop(mine, 12, resume=saved)
    assert _flight_warnings(caught) == []
    assert again["verified"] is None
    err = capfd.readouterr().err
    assert err.count("this resume cannot be verified: the flight record in") == 1, err
    assert f"in {mine} belongs to another run: it holds no entry for this checkpoint" in err


def test_a_resume_that_adopts_the_checkpoints_seed_is_verified_against_that_run(
        tmp_path: Path) -> None:
    first = _loop(tmp_path, 12, save_at=10, seed=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = _loop(tmp_path, 12, resume=first["saved"], seed=7)  # continues seed 5's run
    messages = [str(w.message) for w in caught]
    assert any("it continues that run, with seed 5" in m for m in messages), messages
    assert _flight_warnings(caught) == []
    assert again["verified"] is True and again["losses"] == first["losses"][10:]


def test_an_altered_flight_key_is_refused_before_anything_is_applied(tmp_path: Path) -> None:
    saver = devrng.TrainingRNG(5, flight_record=tmp_path)
    plain = plain_state(saver.state_dict())
    assert isinstance(plain["flight"], str) and len(plain["flight"]) == 16
    assert saver.flight is not None
    saver.flight.close()
    rng = devrng.TrainingRNG(6)
    before = devrng.get_rng_state()
    for bad in ("X" * 16, 12, "0" * 15):
        with pytest.raises(devrng.DevRNGError, match=r"flight record key is .*so the state was "
                                                     r"altered"):
            rng.load_state_dict(resealed(dict(plain, flight=bad)))
        assert devrng.get_rng_state() == before  # nothing applied


# -- never claim more than was compared (section 2) ---------------------------------------------

@pytest.mark.parametrize("order", ["before_step", "after_step"])
def test_a_loss_is_on_the_line_of_its_own_step_in_either_order(tmp_path: Path,
                                                              order: str) -> None:
    run = _loop(tmp_path, 6, loss_at=order)
    (attempt,) = read_record(str(tmp_path / "devrng-flight.rank0.jsonl"))["attempts"].values()
    recorded = [attempt["steps"][s][0]["l"] for s in range(1, 7)]
    assert recorded == [[loss.hex()] for loss in run["losses"]]


def test_a_loss_tensor_given_before_its_backward_joins_that_step(tmp_path: Path) -> None:
    # No tracked loader: nothing but the backward pass says that a step has begun.
    rng = devrng.TrainingRNG(5, flight_record=tmp_path)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(3):
        loss = model(torch.full((2,), float(step))).sum()
        assert rng.flight is not None
        rng.flight.loss(loss)  # before backward: the step under way's
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    rng.flight.close()
    (attempt,) = read_record(str(tmp_path / "devrng-flight.rank0.jsonl"))["attempts"].values()
    assert [attempt["steps"][s][0]["l"] for s in (1, 2, 3)] == [[v.hex()] for v in losses]


@pytest.mark.parametrize("order", ["before_step", "after_step", "none"])
def test_a_computation_difference_is_named_at_its_step_with_or_without_a_loss(
        tmp_path: Path, order: str) -> None:
    first = _loop(tmp_path, 16, save_at=10, loss_at=order)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = _loop(tmp_path, 16, resume=first["saved"], loss_at=order, nondeterministic_at=12)
    found = _flight_warnings(caught)
    assert len(found) == 1, found
    assert ("at step 12 (batch 2 of its epoch from loader 'loader'): the batch and every "
            "generator matched and the parameters after the step did not: nondeterministic "
            "kernels") in found[0], found
    assert "Steps 11 to 11 matched." in found[0]
    assert again["verified"] is False


def test_the_verdict_names_only_what_both_runs_recorded(tmp_path: Path,
                                                        capfd: pytest.CaptureFixture[str]
                                                        ) -> None:
    first = _loop(tmp_path, 16, save_at=10, loss_at="none")
    capfd.readouterr()
    _loop(tmp_path, 16, resume=first["saved"])  # the resumed run gives its losses
    err = capfd.readouterr().err
    assert ("(compared: generators, batch indices, batch content, parameters at every step; "
            "not loss)") in err, err


def test_a_verdict_over_a_damaged_record_counts_only_the_steps_it_compared(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    first = _loop(tmp_path, 16, save_at=10)
    path = tmp_path / "devrng-flight.rank0.jsonl"
    data = bytearray(path.read_bytes())
    data[data.index(b'{"s":13') + 3] ^= 0x01  # step 13's line, damaged
    path.write_bytes(bytes(data))
    capfd.readouterr()
    again = _loop(tmp_path, 16, resume=first["saved"])
    assert again["verified"] is True
    assert ("resume verified: the 5 steps from 11 to 16 that the interrupted run's record holds "
            "drew, consumed and computed exactly") in capfd.readouterr().err


# -- lose nothing (section 3) ---------------------------------------------------------------------

_KILLED = """
import os, signal, sys
import torch
import devrng

kill_at = int(sys.argv[1])
rng = devrng.TrainingRNG(3, flight_record=".")
loader = rng.track("loader", torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.linspace(0, 1, 64).reshape(16, 4)), batch_size=2,
    shuffle=True, **rng.dataloader_kwargs()))
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
if os.path.exists("ckpt.pt"):
    ckpt = torch.load("ckpt.pt", weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    rng.load_state_dict(ckpt["rng"])
    step = ckpt["step"]
while step < 16:  # two epochs of 8 steps
    for (x,) in loader:
        loss = model(x).pow(2).mean()
        if step + 1 == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # killed inside a step, as a job is
        loss.backward()
        opt.step()
        opt.zero_grad()
        rng.flight.loss(loss)
        step += 1
    if step == 8:  # at the end of the first epoch
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "rng": rng.state_dict(), "step": step}, "ckpt.pt")
print("verified", rng.flight.verified)
"""


@pytest.mark.parametrize("kill_at", [9, 10, 12])
def test_a_kill_right_after_a_checkpoint_loses_no_finished_step(tmp_path: Path,
                                                                kill_at: int) -> None:
    # A plain script that configures no logging: the verdict reaches its standard error.
    killed = run_python(_KILLED, cwd=tmp_path, args=(str(kill_at),), timeout=300)
    assert killed.returncode == -9, killed.stderr
    resumed = run_python(_KILLED, cwd=tmp_path, args=("0",), timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    if kill_at == 9:  # killed inside the first step after the checkpoint
        assert ("this resume cannot be verified: the interrupted run's record ends at its "
                "checkpoint (step 8): it stopped before it finished another step"
                in resumed.stderr), resumed.stderr
        assert "verified None" in resumed.stdout
    else:
        assert (f"resume verified: steps 9 to {kill_at - 1} drew, consumed and computed exactly"
                in resumed.stderr), resumed.stderr
        assert "verified True" in resumed.stdout
    assert "DevRNGWarning" not in resumed.stderr


def test_damaged_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    _loop(tmp_path, 5)
    path = tmp_path / "devrng-flight.rank0.jsonl"
    data = bytearray(path.read_bytes())
    data[data.index(b'"s":3') + 3] ^= 0x01  # one flipped bit in step 3's line
    path.write_bytes(bytes(data) + b'{"s":9,"a":"torn')  # and a torn last line
    record = read_record(str(path))
    (attempt,) = record["attempts"].values()
    assert sorted(attempt["steps"]) == [1, 2, 4, 5]
    assert record["damaged"] == 2


def test_the_file_is_pruned_to_the_steps_a_resume_may_need(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flight_module, "PRUNE_BYTES", 1)
    rng = devrng.TrainingRNG(5, flight_record=tmp_path)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 13):
        model(torch.ones(2)).sum().backward()
        opt.step()
        if step % 3 == 0:
            rng.state_dict()  # a checkpoint at steps 3, 6, 9, 12
    assert rng.flight is not None
    rng.flight.close()
    (attempt,) = read_record(str(tmp_path / "devrng-flight.rank0.jsonl"))["attempts"].values()
    assert attempt["id"] is not None  # the header is kept
    # The steps after the last two checkpoints; every checkpoint's line (a resume from an
    # older one is then told why it cannot be verified).
    assert sorted(attempt["steps"]) == [10, 11, 12] and attempt["checkpoints"] == [3, 6, 9, 12]


def test_a_full_disk_stops_the_record_with_one_warning_and_never_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = devrng.TrainingRNG(5, flight_record=tmp_path)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def full(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(flight_module.os, "write", full)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            model(torch.ones(2)).sum().backward()
            opt.step()
        state = rng.state_dict()  # a checkpoint still works (its line is not written)
    found = [str(w.message) for w in caught if w.category is devrng.DevRNGWarning
             and str(tmp_path) in str(w.message)]
    assert len(found) == 1 and "No space left on device" in found[0], found
    assert "stopped" in found[0]
    monkeypatch.undo()
    rng.load_state_dict(state)
    assert rng.flight is not None
    rng.flight.close()


def test_bad_arguments_and_variables_are_sentences(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match=r"flight_record=\.\.\.\) takes a directory .* not 12"):
        devrng.TrainingRNG(1, flight_record=12)  # type: ignore[arg-type]
    monkeypatch.setenv("DEVRNG_MAX_STEPS", "ten")
    with pytest.raises(devrng.DevRNGError, match="DEVRNG_MAX_STEPS is 'ten'; it takes a step"):
        devrng.TrainingRNG(1, flight_record=tmp_path)
    monkeypatch.delenv("DEVRNG_MAX_STEPS")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match="devrng flight record: cannot keep the record in"):
        devrng.TrainingRNG(1, flight_record=blocker / "below")
    assert devrng.TrainingRNG(1).flight is None  # off by default


def test_explain_names_the_part_that_differs_with_its_hint() -> None:
    names = ["cpu", "python", "numpy", "loader:dataloader0"]
    base = {"s": 12, "g": ["a", "b", "c", "d"], "n": 1, "b": "x", "i": "y", "l": ["0x1p-1"],
            "p": ["train", 4]}
    assert explain(base, names, dict(base), names) is None
    assert "the batch holds other samples (its indices differ)" in explain(
        base, names, dict(base, b="x2", i="y2"), names)
    assert "generator numpy differed (cpu, python, dataloader0 matched)" in explain(
        base, names, dict(base, g=["a", "b", "c2", "d"]), names)
    assert "generators python, numpy differed (cpu, dataloader0 matched)" in explain(
        base, names, dict(base, g=["a", "b2", "c2", "d"]), names)
    # A loader's own generator alone (it draws when it prefetches): nothing to say; beside a
    # batch that differs, part of the why.
    assert explain(base, names, dict(base, g=["a", "b", "c", "d2"]), names) is None
    assert ("its indices differ) (the loader's generator dataloader0 differed at the step's "
            "start too)") in explain(base, names, dict(base, g=["a", "b", "c", "d2"], b="x2",
                                                        i="y2"), names)
    assert "consumed 2 batch(es) here and 1" in explain(base, names, dict(base, n=2), names)
    text = explain(base, names, dict(base, l=["0x1p-2"]), names)
    assert text.startswith("step 12 (batch 5 of its epoch from loader 'train'): the batch and "
                           "every generator matched and the loss did not")


def test_explain_names_out_of_order_loaders_the_training_loop_and_untracked_generators(
        ) -> None:
    """Issue 44: a loader built with in_order=False (two uninterrupted runs already differ); a
    batch read at the model's input (HF Trainer, accelerate), which the training loop had
    first; and a generator devrng does not track, among the causes of a computation."""
    names = ["cpu"]
    base = {"s": 3, "g": ["a"], "n": 1, "b": "x", "i": None, "w": "p"}
    assert ("step 3: the batch differs: the loader is built with in_order=False: its workers "
            "hand over the batches in the order they finish them") in explain(
        dict(base, u=1), names, dict(base, u=1, b="x2"), names)
    plain = explain(dict(base, i="y"), names, dict(base, i="y", b="x2"), names)
    assert "randomness inside the dataset or collate_fn" in plain
    assert "in the training loop" not in plain
    assert "a generator devrng does not track (one kept on the dataset or the model" in plain
    at_model = explain(dict(base, i="y", m=1), names, dict(base, i="y", m=1, b="x2"), names)
    assert ("the batch's indices match and its content does not: randomness the batch met "
            "before the model's forward pass") in at_model
    assert "or in the training loop (noise added to the inputs)" in at_model
    assert "in the training loop" in explain(dict(base, m=1), names,
                                             dict(base, m=1, b="x2"), names)
    computed = explain(base, names, dict(base, w="p2"), names)
    assert ("or a draw in the step from a generator devrng does not track (one kept on the "
            "dataset or the model") in computed


def test_the_lines_say_out_of_order_batches_and_batches_read_at_the_model(
        tmp_path: Path) -> None:
    rng = devrng.TrainingRNG(0, flight_record=tmp_path / "loop")
    data = torch.utils.data.TensorDataset(torch.arange(16.0).reshape(8, 2))
    loader = rng.track("loader", torch.utils.data.DataLoader(
        data, batch_size=2, num_workers=2, in_order=False, **rng.dataloader_kwargs()))
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for (x,) in loader:
        model(x).sum().backward()
        opt.step()
    assert rng.flight is not None
    rng.flight.close()
    (attempt,) = read_record(str(tmp_path / "loop" / "devrng-flight.rank0.jsonl")
                             )["attempts"].values()
    lines = [line for line, _ in attempt["steps"].values()]
    assert len(lines) == 4 and all(line.get("u") == 1 and "m" not in line for line in lines)
    flight = devrng.FlightRecord(tmp_path / "model", rank=0, identity={}, sources=list,
                                 hooked=True)
    flight.watch_model(model)
    model(torch.ones(2)).sum().backward()
    opt.step()
    flight.close()
    (attempt,) = read_record(str(tmp_path / "model" / "devrng-flight.rank0.jsonl")
                             )["attempts"].values()
    [(line, _)] = attempt["steps"].values()
    assert line.get("m") == 1 and "u" not in line


# -- in fresh processes, as users resume ------------------------------------------------------

def _needs_its_loader(config: dict[str, Any] | None) -> None:
    if (config or {}).get("loader", "stateful") == "stateful":  # (the core environment's)
        pytest.importorskip("torchdata.stateful_dataloader")


def _run(directory: Path, config: dict[str, Any], **env: str) -> dict[str, Any]:
    _needs_its_loader(config)
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"result{len(list(directory.glob('result*')))}.json"
    proc = run_python("tests._flight_run", module=True, cwd=directory,
                      args=(json.dumps(config), str(out)), env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()) if out.exists() else {}


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["stateful", "plain"])
def test_an_exact_resume_in_a_fresh_process_is_verified_and_silent(tmp_path: Path,
                                                                   loader: str) -> None:
    """Stopped after step 9 with a checkpoint at step 6 (the plain loader: at the end of the
    first epoch, step 6), resumed: every step after the checkpoint matches, no warning."""
    config = {"loader": loader, "save_at": [6]}
    _run(tmp_path, config, DEVRNG_MAX_STEPS="9")
    resumed = _run(tmp_path, config)
    assert resumed["resumed"] == 6
    assert resumed["warnings"] == [], resumed["warnings"]
    assert resumed["verified"] is True
    assert any("resume verified: steps 7 to 9" in m for m in resumed["logged"])


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    # augmentation from torch's generator in the workers, saved inside an epoch
    {"augment": "torch", "save_at": [4]},
    # NumPy in the collate_fn (the workers' NumPy), saved inside an epoch
    {"collate": "numpy", "save_at": [4]},
], ids=["augmentation-outside-sample_rng", "numpy-in-collate_fn"])
def test_a_resume_that_is_not_exact_names_the_step_and_the_cause(
        tmp_path: Path, config: dict[str, Any]) -> None:
    """The load names the cause (the workers drew outside sample_rng); the record the step,
    as that warning's (issue 44: no second warning, of another cause)."""
    _run(tmp_path, config, DEVRNG_MAX_STEPS="8")
    resumed = _run(tmp_path, config)
    [warning] = resumed["warnings"]
    assert ("the workers of the loader 'loader' drew random numbers outside devrng.sample_rng "
            "(in the dataset or in its collate_fn)") in warning
    assert any("differs from the interrupted one from step 5 (batch 5 of its epoch from loader "
               "'loader'), as warned when it loaded" in m for m in resumed["logged"])
    assert resumed["verified"] is False


@pytest.mark.slow
def test_a_difference_warned_of_at_load_is_not_warned_of_again(tmp_path: Path) -> None:
    """Resumed with batch size 5 for 4: the load names the cause; the record, which sees the
    first step differ, says so as that warning's, with no second warning of another cause."""
    _run(tmp_path, {"save_at": [4]}, DEVRNG_MAX_STEPS="8")
    resumed = _run(tmp_path, {"save_at": [4], "batch": 5})
    [warning] = resumed["warnings"]
    assert "the loader 'loader' had batch size 4 and has 5" in warning
    assert any("the resumed run differs from the interrupted one from step 5 (batch 5 of its "
               "epoch from loader 'loader'), as warned when it loaded" in m
               for m in resumed["logged"]), resumed["logged"]
    assert resumed["verified"] is False


# -- devrng check-resume --------------------------------------------------------------------

def _check(tmp_path: Path, *args: str, config: dict[str, Any] | None = None,
           script: str | None = None) -> Any:
    if script is None:
        _needs_its_loader(config)
    command = ([sys.executable, "-m", "tests._flight_run", json.dumps(config or {}), "out.json"]
               if script is None else [sys.executable, script])
    return run_python("devrng", module=True, cwd=tmp_path, timeout=900, inherit_env=True,
                      args=("check-resume", *args, "--", *command),
                      env={"DEVRNG_SEED": None})


@pytest.mark.slow
def test_check_resume_says_exact_and_exits_0(tmp_path: Path) -> None:
    proc = _check(tmp_path, "--steps", "10", "--stop", "5", config={"save_at": [3, 6, 9]})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("resume exact for steps 7 to 10 (checkpoint at step 6; compared: generators, batch "
            "indices, batch content, loss, parameters at every step)") in proc.stdout


@pytest.mark.slow
def test_check_resume_names_the_first_differing_step_and_exits_1(tmp_path: Path) -> None:
    proc = _check(tmp_path, "--steps", "10", "--stop", "4",
                  config={"augment": "torch", "save_at": [4, 8]})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("resume differs at step 5 (batch 5 of its epoch from loader 'loader'): the batch's "
            "indices match and its content does not") in proc.stdout
    assert "(the runs' directories, records and output are in" in proc.stdout


@pytest.mark.slow
def test_check_resume_sees_a_computation_difference_without_a_loss(tmp_path: Path) -> None:
    # No loss is recorded; the resumed run's gradients drift (as a nondeterministic kernel's):
    # the parameters after step 7 tell.
    proc = _check(tmp_path, "--steps", "10", "--stop", "5",
                  config={"save_at": [6], "loss": False, "resumed": "drift"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("resume differs at step 7 (batch 1 of its epoch from loader 'loader'): the batch "
            "and every generator matched and the parameters after the step did not") \
        in proc.stdout, proc.stdout


@pytest.mark.slow
def test_check_resume_does_not_pass_a_resume_it_compared_in_part(tmp_path: Path) -> None:
    proc = _check(tmp_path, "--steps", "10", "--stop", "5",
                  config={"save_at": [6], "resumed": "short"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("the resumed run recorded 2 steps of the 4 after the checkpoint of step 6 that the "
            "uninterrupted run recorded (none from step 9); it was not compared in full"
            in proc.stdout), proc.stdout


@pytest.mark.slow
def test_check_resume_cannot_check_a_script_without_a_record_and_says_why(
        tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text("import torch\nm = torch.nn.Linear(2, 1)\n"
                                       "torch.optim.SGD(m.parameters(), lr=1).step()\n")
    proc = _check(tmp_path, script="plain.py")
    assert proc.returncode == 2
    assert "the uninterrupted run recorded no step: the script must train with" in proc.stdout


@pytest.mark.slow
def test_check_resume_without_a_checkpoint_after_the_stop_exits_2(tmp_path: Path) -> None:
    proc = _check(tmp_path, "--steps", "8", "--stop", "5", config={"save_at": [2]})
    assert proc.returncode == 2
    assert ("the run saved no checkpoint at or after step 5 (its checkpoints: 2)"
            in proc.stdout), proc.stdout


def test_check_resume_never_calls_a_resume_exact_on_no_compared_step() -> None:
    from tests._internals import CouldNotCheck, compare_runs

    line = {"s": 1, "a": "x", "g": ["0a"], "w": "c1"}
    record = {"attempts": {"x": {"id": None, "steps": {1: (line, ["cpu"])}, "checkpoints": [1],
                                 "from": None, "end": None}}, "damaged": 0}
    resumed = {"attempts": {**record["attempts"],
                            "y": {"id": None, "steps": {}, "checkpoints": [], "from": ("x", 1),
                                  "end": None}}, "damaged": 0}
    with pytest.raises(CouldNotCheck, match="recorded no step after the checkpoint of step 1"):
        compare_runs({0: record}, {0: resumed}, {0: ("x", 1)})


def test_check_resume_refuses_bad_arguments(tmp_path: Path) -> None:
    from devrng.__main__ import main

    assert main(["check-resume", "--steps", "5", "--stop", "5", "--", "python", "x.py"]) == 2
    assert main(["check-resume"]) == 2


# -- on a device, for real: XLA on the CPU (the xla environment) ----------------------------

@pytest.mark.xla
def test_a_batch_on_xla_is_digested_there_and_equals_its_cpu_digest() -> None:
    """Integer sums give one answer in any order: the digest of a batch on an XLA device,
    read once the line is written, is the digest of the same bytes on the CPU."""
    pytest.importorskip("torch_xla")
    from tests._internals import digest_module

    x = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))  # sampled
    y = torch.arange(64)
    on_xla = batch_digest((x.to("xla"), y.to("xla")))
    assert isinstance(on_xla, digest_module.Pending)  # nothing read yet
    assert digest_module.resolve([on_xla]) == [batch_digest((x, y))]
    changed = x.clone()
    changed[5, 1, 2, 3] += 1.0  # one sample's pixel, in a sampled place or not: compare on CPU
    assert (digest_module.resolve([batch_digest((changed.to("xla"), y.to("xla")))])
            == [batch_digest((changed, y))])


@pytest.mark.xla
def test_a_run_on_xla_resumes_verified_with_its_losses_read_in_batches(tmp_path: Path) -> None:
    pytest.importorskip("torch_xla")
    import torch_xla

    def run(steps: int, resume: dict[str, Any] | None = None) -> dict[str, Any]:
        rng = devrng.TrainingRNG(7, flight_record=tmp_path)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5),
                                    torch.nn.Linear(8, 1)).to("xla")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        done, saved, losses = 0, None, []
        if resume is not None:
            model.load_state_dict(resume["model"])
            opt.load_state_dict(resume["opt"])
            rng.load_state_dict(resume["rng"])
            done = resume["step"]
        x = torch.linspace(0, 1, 32).reshape(8, 4).to("xla")
        while done < steps:
            loss = model(x).pow(2).mean()  # dropout on the device
            loss.backward()
            opt.step()
            opt.zero_grad()
            torch_xla.sync()
            assert rng.flight is not None
            rng.flight.loss(loss)  # stays on the device until the line is written
            done += 1
            losses.append(loss.item())
            if done == 3:
                saved = {"rng": rng.state_dict(), "step": done,
                         "model": {k: v.cpu() for k, v in model.state_dict().items()},
                         "opt": copy.deepcopy(opt.state_dict())}
        assert rng.flight is not None
        rng.flight.finish()
        return {"saved": saved, "losses": losses, "verified": rng.flight.verified}

    first = run(6)
    again = run(6, resume=first["saved"])
    assert again["losses"] == first["losses"][3:]
    assert again["verified"] is True


def test_a_cpu_digest_is_the_weighted_wrapping_sum_the_docs_define() -> None:
    """What the digest module's docstring defines, computed here from the definition: the
    elements' integer bits (float32 as int32, a complex number as its two parts), each times
    ``2 * position + 1``, summed modulo 2**64 over all elements or, past SAMPLED, over RUNS
    runs of RUN elements spread evenly; hashed with the tensor's dtype and shape."""
    import hashlib

    def expected(t: torch.Tensor, bits: torch.dtype) -> str:
        flat = (torch.view_as_real(t) if t.is_complex() else t).reshape(-1).view(bits).tolist()
        n, runs, run = len(flat), digest_module.RUNS, digest_module.RUN
        stride = n // runs
        positions = (range(n) if n <= digest_module.SAMPLED else
                     [r * stride + k for r in range(runs) for k in range(run)])
        total = sum(flat[p] * (2 * p + 1) for p in positions) % 2**64
        header = f"T{t.dtype}{tuple(t.shape)}".encode()
        return hashlib.blake2b(header + total.to_bytes(8, "little"), digest_size=8).hexdigest()

    torch.manual_seed(0)
    cases = [(torch.randn(3, 5), torch.int32), (torch.randn(64, 1, 28, 28), torch.int32),
             (torch.randint(-2**62, 2**62, (5000,)), torch.int64),
             (torch.randn(7, dtype=torch.complex64), torch.int32),
             (torch.randn(300).to(torch.bfloat16), torch.int16)]
    for t, bits in cases:
        assert batch_digest(t) == expected(t, bits), t.dtype


def test_a_strided_complex_tensor_is_digested_as_its_contiguous_copy() -> None:
    """(Read through NumPy, a strided complex tensor could not be viewed as integers: the
    digest raised, and with it the training step.)"""
    x = torch.randn(5000, dtype=torch.complex64)
    assert batch_digest(x[::2]) == batch_digest(x[::2].contiguous())
    assert batch_digest(x[::2]) != batch_digest(x[1::2].contiguous())


def test_parameter_views_digest_as_the_batch_digest_and_follow_the_parameters() -> None:
    """The record's parameter digest keeps each CPU parameter's sampled view and reads it in
    place: it equals batch_digest after in-place updates, after ``p.data = ...`` (new memory,
    or another shape), for tensors it does not keep (strided, bfloat16), and it forgets a
    parameter that is gone."""
    import gc

    views = digest_module.Views()
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(128, 9216)), torch.nn.Parameter(torch.randn(10)),
              torch.randn(20, 30)[:, ::2], torch.randn(3000).to(torch.bfloat16),
              torch.randn(5, dtype=torch.complex64), torch.arange(7)]
    before = views.digest(params)
    assert before == batch_digest(params)
    with torch.no_grad():
        params[0].view(-1)[digest_module.RUN - 1] += 1.0  # inside the first run
        params[1].mul_(2)
    assert views.digest(params) == batch_digest(params) != before
    params[0].data = params[0].data.clone()  # new memory, same values
    assert views.digest(params) == batch_digest(params)
    params[1].data = torch.randn(20)  # another shape
    assert views.digest(params) == batch_digest(params)
    params[0].data = params[0].data.t()  # other strides: read as they are now
    assert views.digest(params) == batch_digest(params)
    kept = len(views._found)
    del params[1]
    gc.collect()
    assert len(views._found) == kept - 1


def test_indices_digest_of_a_steps_batches_sees_their_bounds_and_order() -> None:
    """A step's batches (each a list of indices, what a batch sampler yields): where one batch
    ends is part of the digest, as is the order inside and across batches."""
    assert indices_digest([[1, 2], [3]]) == indices_digest([[1, 2], [3]])
    assert indices_digest([[1, 2], [3]]) != indices_digest([[1], [2, 3]])
    assert indices_digest([[1, 2], [3]]) != indices_digest([[2, 1], [3]])
    assert indices_digest([[1, 2], [3]]) != indices_digest([[3], [1, 2]])
    assert indices_digest([[1, 2]]) != indices_digest([1, 2])
    assert indices_digest([[1, 2]]) == indices_digest([(1, 2)])
    assert indices_digest([["a"], ["b"]]) != indices_digest([["b"], ["a"]])  # by repr
    assert indices_digest([[1.5]]) != indices_digest([[1.25]])  # not ints: by repr

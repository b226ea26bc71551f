"""Mistakes users make, each answered with a sentence that says what to do (issue 47)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from tests._helpers import run_python

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


# -- a fork never entered ----------------------------------------------------------------
def _never_entered(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if "never entered" in str(w.message)]


def _said_after(make: Callable[[], None]) -> list[warnings.WarningMessage]:
    """The never-entered warnings said by the fork_rng call that follows ``make()``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make()
        with devrng.fork_rng(devices=[]):  # the next call says what was freed before it
            pass
    return _never_entered(caught)


@pytest.fixture
def locating() -> Iterator[list[bool]]:
    """Whether forks record the line that makes them (on once one was found never entered):
    on for the test, then as it was."""
    from tests._internals import fork_module

    switch: list[bool] = fork_module._LOCATING
    was = switch[0]
    switch[0] = True
    yield switch
    switch[0] = was


def test_a_fork_never_entered_warns_at_the_line_that_made_it(locating: list[bool]) -> None:
    lines: list[int] = []

    def make() -> None:
        lines.append(sys._getframe().f_lineno + 1)
        devrng.fork_rng(devices=[])  # the common call (the CPU's own fork)
        lines.append(sys._getframe().f_lineno + 1)
        devrng.fork_rng(devices=None, python=True)
        lines.append(sys._getframe().f_lineno + 1)
        kept = devrng.fork_rng(devices=[])  # kept, then dropped unentered
        del kept

    found = _said_after(make)
    assert sorted(w.lineno for w in found) == lines
    assert {Path(w.filename).name for w in found} == {Path(__file__).name}
    assert all(w.category is devrng.DevRNGWarning for w in found)
    assert "forked nothing: write `with devrng.fork_rng(...):`" in str(found[0].message)


def test_the_first_fork_never_entered_is_said_where_it_was_found_then_each_where_it_was_made(
        locating: list[bool]) -> None:
    """Reading the line that makes a fork costs more than the rest of its making: forks
    record it once one was found never entered (as Python names where a coroutine never
    awaited was made only under tracemalloc)."""
    locating[0] = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            found_at = sys._getframe().f_lineno + 1
            devrng.fork_rng(devices=[])  # made at this line, and found by the next round's
        flush_at = sys._getframe().f_lineno + 1
        with devrng.fork_rng(devices=[]):  # finds the last round's
            pass
    first, *later = _never_entered(caught)
    assert (Path(first.filename).name, first.lineno) == (Path(__file__).name, found_at)
    assert str(first.message).endswith("(Found by the fork_rng call here, which came after "
                                       "it; from now on the warning names the line that made "
                                       "such a fork.)")
    assert [w.lineno for w in later] == [found_at, found_at] != [flush_at] * 2
    assert all(str(w.message).endswith("(@devrng.fork_rng(...)).") for w in later)
    assert locating[0]


def test_a_fork_entered_or_made_a_decorator_does_not_warn() -> None:
    def make() -> None:
        with devrng.fork_rng(devices=[]):
            torch.rand(1)
        with devrng.fork_rng(devices=None, numpy=True):
            torch.rand(1)
        fork = devrng.fork_rng(devices=[])
        with fork:  # entered later
            torch.rand(1)
        del fork

        @devrng.fork_rng(devices=[])
        def draw() -> torch.Tensor:
            return torch.rand(1)

        draw()  # (the fork of each call is made by devrng, and entered)
        del draw
        with pytest.raises(ValueError, match="'cuda:99' does not exist"), \
                devrng.fork_rng(devices=["cuda:99"]):  # entered, and failed there
            pass

    assert _said_after(make) == []


def test_a_fork_freed_unentered_runs_no_python_code_of_devrng() -> None:
    """What makes the warning safe: freeing the fork runs no Python code of devrng's (a C
    function notes it), so no Ctrl-C can land in a finalizer, where Python would swallow it.
    The warning comes from the next fork_rng call, which changes nothing before it."""
    fork = devrng.fork_rng(devices=[])
    ran: list[str] = []
    sys.setprofile(lambda frame, event, arg: ran.append(frame.f_code.co_filename)
                   if event == "call" else None)
    try:
        del fork
    finally:
        sys.setprofile(None)
    assert not [f for f in ran if "devrng" in f], ran
    with pytest.warns(devrng.DevRNGWarning, match="never entered"), devrng.fork_rng(devices=[]):
        pass


# -- torch.manual_seed inside devrng.portable --------------------------------------------
_RESEEDED = "torch's generator was seeded inside this devrng.portable block"


@pytest.mark.parametrize(("before", "inside"), [
    (lambda: (torch.manual_seed(0), torch.rand(1)), lambda: torch.manual_seed(0)),  # same seed
    (lambda: torch.manual_seed(0), lambda: torch.manual_seed(7)),  # another seed
    (lambda: torch.rand(1), lambda: devrng.manual_seed(3)),
], ids=["the seed it had, after draws", "another seed", "devrng.manual_seed"])
def test_torch_manual_seed_inside_portable_warns_that_the_draws_went_on(
        before: Callable[[], object], inside: Callable[[], object]) -> None:
    with devrng.portable(seed=5):
        expected = (torch.rand(3), torch.rand(3))
    before()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with devrng.portable(seed=5):
            first = torch.rand(3)
            inside()
            second = torch.rand(3)  # op 1 of seed 5's stream, as the warning says
    caught = [w for w in caught if _RESEEDED in str(w.message)]
    assert len(caught) == 1 and caught[0].category is devrng.DevRNGWarning
    assert torch.equal(first, expected[0]) and torch.equal(second, expected[1])
    assert "enter devrng.portable(seed) there instead" in str(caught[0].message)
    assert Path(caught[0].filename).name == Path(__file__).name


def test_a_portable_block_without_a_seeding_inside_does_not_warn() -> None:
    torch.manual_seed(0)  # seeded before the block, nothing drawn since: as it enters
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stream = devrng.portable(seed=5)
        with stream:
            torch.rand(3)
            with devrng.fork_rng(devices=[]):  # put back as it was at the fork's entry
                torch.manual_seed(1)
        with stream, stream:  # entered again, nested
            torch.nn.functional.dropout(torch.ones(4), 0.5)
        torch.rand(1, generator=torch.Generator().manual_seed(2))
        with devrng.portable(seed=6):
            torch.randn(2, generator=torch.Generator().manual_seed(3))  # its own generator
    assert [str(w.message) for w in caught if _RESEEDED in str(w.message)] == []


def test_a_fork_freed_after_the_last_fork_rng_call_is_said_at_exit() -> None:
    once = run_python("import devrng\ndevrng.fork_rng(devices=[])\n")
    assert once.returncode == 0, once.stderr
    assert once.stderr.count("never entered") == 1, once.stderr
    assert "(Found at the program's exit: the line that made it is named for forks made " \
           "after a first one was found.)" in once.stderr
    twice = run_python("import devrng\n"
                       "def step():\n"
                       "    devrng.fork_rng(devices=[])\n"
                       "step()\n"
                       "step()\n")
    assert twice.returncode == 0, twice.stderr
    said = [line for line in twice.stderr.splitlines() if "never entered" in line]
    assert len(said) == 2, twice.stderr  # found by the second call, then at exit: its line
    assert all(line.startswith("<string>:3: DevRNGWarning: devrng.fork_rng(...) was called "
                               "but never entered") for line in said)
    assert said[1].endswith("(@devrng.fork_rng(...)).")
    quiet = run_python("import devrng\nwith devrng.fork_rng(devices=[]):\n    pass\n")
    assert quiet.returncode == 0 and "never entered" not in quiet.stderr, quiet.stderr

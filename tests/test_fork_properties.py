"""Property: any nesting of forks, with exceptions raised anywhere, restores every generator.

Runs over the real CPU generator, Python, NumPy and two SIMULATED device types.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests._helpers import generator_states

import devrng


class Boom(Exception):
    pass


# A program is a list of steps: ("draw", where) | ("fork", flags, program, raise_at_end)
where = st.sampled_from(["cpu", "python", "numpy", "xpu0", "xpu1", "cuda0"])
programs = st.recursive(
    st.lists(st.tuples(st.just("draw"), where), max_size=3),
    lambda inner: st.lists(
        st.one_of(
            st.tuples(st.just("draw"), where),
            st.tuples(st.just("fork"), st.sampled_from(["all", "xpu", "cpu-only", "host"]),
                      inner, st.booleans()),
        ),
        max_size=4,
    ),
    max_leaves=12,
)


def run(program: list[Any], fakes: dict[str, Any]) -> None:
    for step in program:
        if step[0] == "draw":
            w = step[1]
            if w == "cpu":
                torch.rand(2)
            elif w == "python":
                random.random()
            elif w == "numpy":
                np.random.rand()
            else:
                fakes[w[:-1]].draw(int(w[-1]))
            continue
        _, flags, inner, raise_at_end = step
        kwargs: dict[str, Any] = {
            "all": {"devices": ["xpu:0", "xpu:1", "cuda:0"], "python": True, "numpy": True},
            "xpu": {"device_type": "xpu"},
            "cpu-only": {"devices": []},
            "host": {"devices": [], "python": True, "numpy": True},
        }[flags]
        before = snapshot(fakes)
        try:
            with devrng.fork_rng(**kwargs):
                run(inner, fakes)
                if raise_at_end:
                    raise Boom
        except Boom:
            pass
        after = snapshot(fakes)
        covered = {"all": {"cpu", "python", "numpy", "xpu", "cuda"}, "xpu": {"cpu", "xpu"},
                   "cpu-only": {"cpu"}, "host": {"cpu", "python", "numpy"}}[flags]
        for key in covered:
            assert before[key] == after[key], f"{key} not restored by fork({flags})"


def snapshot(fakes: dict[str, Any]) -> dict[str, Any]:
    states = generator_states(fakes["xpu"], fakes["cuda"])
    return {"cpu": states.cpu, "python": states.python, "numpy": states.numpy,
            "xpu": states.devices[0], "cuda": states.devices[1]}


@pytest.fixture
def fakes(simulate_device: Any) -> dict[str, Any]:
    return {"xpu": simulate_device("xpu", count=2), "cuda": simulate_device("cuda", count=1)}


@pytest.mark.filterwarnings("ignore:.* reports that you have:UserWarning")  # tested in test_fork
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=programs)
def test_random_nested_forks_restore_everything(program: list[Any], fakes: dict[str, Any]) -> None:
    run([("fork", "all", program, False)], fakes)

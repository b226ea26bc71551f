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
            assert equal(before[key], after[key]), f"{key} not restored by fork({flags})"


def snapshot(fakes: dict[str, Any]) -> dict[str, Any]:
    return {
        "cpu": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(legacy=False),
        "xpu": [g.get_state() for g in fakes["xpu"].generators],
        "cuda": [g.get_state() for g in fakes["cuda"].generators],
    }


def equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return bool(torch.equal(a, b))
    if isinstance(a, list):
        return all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return (a["state"]["pos"] == b["state"]["pos"] and a["has_gauss"] == b["has_gauss"]
                and np.array_equal(a["state"]["key"], b["state"]["key"]))
    return bool(a == b)


@pytest.fixture
def fakes(simulate_device: Any, monkeypatch: Any) -> dict[str, Any]:
    from devrng import _plan

    monkeypatch.setattr(_plan, "_warned", {"xpu", "cuda"})  # the many-devices warning is tested elsewhere
    return {"xpu": simulate_device("xpu", count=2), "cuda": simulate_device("cuda", count=1)}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=programs)
def test_random_nested_forks_restore_everything(program: list[Any], fakes: dict[str, Any]) -> None:
    run([("fork", "all", program, False)], fakes)

"""devrng.testing.locate_divergence between runs on the CPU, on real nondeterminism (an op
summing in an order drawn from os.urandom, a generator seeded from it), and its refusals.
The cross-device case runs for real on XLA in tests/test_locate_xla.py."""

from __future__ import annotations

import itertools
import os
from collections import OrderedDict

import numpy as np
import pytest
import torch
from tests._nondeterministic import Noise, Pool, Scale, batch, model

from devrng.testing import locate_divergence


def test_an_op_that_sums_in_a_random_order_is_located_in_the_forward() -> None:
    found = locate_divergence(model(Pool()), batch(), runs=3)
    assert (found.ok, found.module, found.op, found.phase, found.kind) == (
        False, "pool", "devrng_test::unordered_sum", "forward", "op")
    assert found.mismatched > 0 and found.max_abs > 0
    text = str(found)
    assert "forward of module pool, op devrng_test::unordered_sum" in text
    assert "custom op (devrng_test" in text  # the hint


def test_an_op_only_in_the_backward_is_located_in_the_backward() -> None:
    found = locate_divergence(model(Scale(8)), batch(), runs=3)
    assert (found.ok, found.module, found.op, found.phase, found.kind) == (
        False, "scale", "devrng_test::unordered_sum", "backward", "op")
    assert "backward of module scale" in str(found)


def test_a_generator_seeded_from_urandom_is_named_as_the_generator() -> None:
    found = locate_divergence(model(Noise()), batch())
    assert (found.ok, found.module, found.op, found.phase, found.kind) == (
        False, "noise", "aten::randn", "forward", "generator")
    assert "generator was in another state" in str(found)


def test_a_deterministic_model_with_dropout_passes_twenty_runs() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                              torch.nn.Dropout(0.5), torch.nn.Linear(16, 2)).train()
    x = batch().requires_grad_()
    before = torch.get_rng_state()
    statistics = net[1].running_mean.clone()
    found = locate_divergence(net, x, runs=20)
    assert torch.equal(net[1].running_mean, statistics)  # each run started from them
    assert found.ok and found.module is None and found.op is None and found.report is None
    assert str(found).startswith("No divergence: 20 runs of Sequential on cpu, forward (")
    assert ") and backward (" in str(found)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG state is back
    assert net[0].weight.grad is None and x.grad is None  # nothing accumulated


def test_a_function_that_writes_to_its_input_is_given_a_fresh_copy_each_run() -> None:
    x = torch.ones(4)
    assert locate_divergence(lambda t: t.mul_(2), x).ok
    assert torch.equal(x, torch.ones(4))


def test_memory_freed_before_it_was_written_is_not_read_as_unwritten_when_handed_out_again(
        ) -> None:
    # torch.empty's memory is digested by its shape until an op writes it. Freed unwritten,
    # the allocator hands its address out again (to torch.ones here, in most runs but not
    # all): read as still unwritten there, the buffer NumPy filled was digested by its shape
    # in some runs and by its bytes in others, a difference in 19 of 20 checks.
    def fill(x: torch.Tensor) -> torch.Tensor:
        scratch = torch.empty(1024)
        del scratch
        buffer = torch.ones(1024)
        buffer.numpy()[:] = 3
        return x * buffer

    found = [locate_divergence(fill, torch.ones(1024)) for _ in range(20)]
    assert all(f.ok for f in found), next(str(f) for f in found if not f.ok)


def test_a_value_from_outside_torch_is_an_input_difference() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        noise = torch.from_numpy(np.frombuffer(os.urandom(32), dtype=np.float32).copy())
        return (x.exp() + noise.nan_to_num()).sum()

    found = locate_divergence(fn, torch.ones(8))
    assert (found.ok, found.module, found.op, found.kind) == (
        False, None, "aten::lift_fresh", "input")  # (the op that takes in a NumPy array)


def test_other_control_flow_is_a_path_difference() -> None:
    calls = itertools.count()
    found = locate_divergence(lambda x: x.sin() if next(calls) % 2 else x.cos(), torch.ones(3))
    assert (found.ok, found.kind, found.op) == (False, "path", "aten::cos")
    assert "other ops from here on" in str(found)


def test_two_devices_of_one_type_agree_module_by_module_dropout_included() -> None:
    net = torch.nn.Sequential(OrderedDict(a=torch.nn.Linear(8, 8), b=torch.nn.Dropout(0.5)))
    found = locate_divergence(net.train(), batch(), devices=("cpu", "cpu"))
    assert found.ok, str(found)  # each call drew from the state the reference's call did
    assert "module by module (3 calls" in str(found)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"runs": 1}, "runs=1 must be an int of at least 2"),
    ({"runs": True}, "runs=True must be an int of at least 2"),
    ({"devices": ("cpu",)}, "devices=('cpu',) must name two devices"),
    ({"devices": "cpu"}, "devices='cpu' must name two devices"),
    ({"devices": ("cpu", "gpu:0")}, "'gpu:0' in devices is not a device"),
    ({"rtol": 0.1}, "rtol=0.1 and atol=None: give both tolerances or neither"),
])
def test_bad_input_is_refused_with_the_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        locate_divergence(torch.nn.Linear(2, 2), torch.ones(2), **kwargs)  # type: ignore[arg-type]


def test_something_not_callable_is_refused() -> None:
    with pytest.raises(TypeError, match="fn=3 is not callable"):
        locate_divergence(3, torch.ones(2))  # type: ignore[arg-type]
